package sim

import (
	"bufio"
	"errors"
	"os"

	"github.com/apache/arrow/go/v17/arrow"
	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/memory"
	"github.com/apache/arrow/go/v17/parquet"
	"github.com/apache/arrow/go/v17/parquet/compress"
	"github.com/apache/arrow/go/v17/parquet/pqarrow"
)

// columns are WriteParquet's, in order: one table of name, type and value,
// so the schema and the rows cannot drift apart.
var columns = []struct {
	name string
	typ  arrow.DataType
	put  func(array.Builder, *Outcome)
}{
	{"index", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.Index) })},
	{"arrival_ns", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.Arrival) })},
	{"input_tokens", arrow.PrimitiveTypes.Int32, i32(func(o *Outcome) int { return o.InputTokens })},
	{"output_tokens", arrow.PrimitiveTypes.Int32, i32(func(o *Outcome) int { return o.OutputTokens })},
	{"prefill_instance", arrow.BinaryTypes.String, str(func(o *Outcome) string { return o.Prefill })},
	{"decode_instance", arrow.BinaryTypes.String, str(func(o *Outcome) string { return o.Decode })},
	{"rejected", arrow.FixedWidthTypes.Boolean, func(b array.Builder, o *Outcome) {
		b.(*array.BooleanBuilder).Append(o.Rejected)
	}},
	{"reject_reason", arrow.BinaryTypes.String, str(func(o *Outcome) string { return o.Reason })},
	{"hit_tokens", arrow.PrimitiveTypes.Int32, i32(func(o *Outcome) int { return o.HitTokens })},
	{"pulled_tokens", arrow.PrimitiveTypes.Int32, i32(func(o *Outcome) int { return o.PulledTokens })},
	{"ttft_ns", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.TTFT) })},
	{"tbt_ns", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.TBT) })},
	{"prefill_ns", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.PrefillTime) })},
	{"finish_ns", arrow.PrimitiveTypes.Int64, i64(func(o *Outcome) int64 { return int64(o.Finish) })},
}

func i64(f func(*Outcome) int64) func(array.Builder, *Outcome) {
	return func(b array.Builder, o *Outcome) { b.(*array.Int64Builder).Append(f(o)) }
}

func i32(f func(*Outcome) int) func(array.Builder, *Outcome) {
	return func(b array.Builder, o *Outcome) { b.(*array.Int32Builder).Append(int32(f(o))) }
}

func str(f func(*Outcome) string) func(array.Builder, *Outcome) {
	return func(b array.Builder, o *Outcome) { b.(*array.StringBuilder).Append(f(o)) }
}

var parquetSchema = func() *arrow.Schema {
	fields := make([]arrow.Field, len(columns))
	for i, c := range columns {
		fields[i] = arrow.Field{Name: c.name, Type: c.typ}
	}
	return arrow.NewSchema(fields, nil)
}()

// ParquetColumns returns the column names of WriteParquet's file, in
// order: Outcome's fields in snake case, times in nanoseconds, instances
// and reject_reason empty where they do not apply.
func ParquetColumns() []string {
	names := make([]string, len(columns))
	for i, c := range columns {
		names[i] = c.name
	}
	return names
}

// WriteParquet writes the outcomes to a new Parquet file at path, one row
// per request in trace order, zstd-compressed.
func (r *Result) WriteParquet(path string) (err error) {
	b := array.NewRecordBuilder(memory.DefaultAllocator, parquetSchema)
	defer b.Release()
	b.Reserve(len(r.Outcomes))
	for i := range r.Outcomes {
		for j, c := range columns {
			c.put(b.Field(j), &r.Outcomes[i])
		}
	}
	rec := b.NewRecord()
	defer rec.Release()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	// A bufio.Writer is no io.Closer, so the Parquet writer leaves the file
	// to us.
	bw := bufio.NewWriterSize(f, 1<<20)
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Zstd))
	pw, err := pqarrow.NewFileWriter(parquetSchema, bw, props, pqarrow.DefaultWriterProps())
	if err != nil {
		return err
	}
	if err := pw.Write(rec); err != nil {
		return errors.Join(err, pw.Close())
	}
	if err := pw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

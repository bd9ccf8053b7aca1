package trace

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

// columns are WriteParquet's, in order: a name, a type and the value of a
// request. One table, so the schema and the rows cannot drift apart.
var columns = []struct {
	name string
	typ  arrow.DataType
	put  func(array.Builder, *RequestResult)
}{
	{"index", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.Index) })},
	{"timestamp_ms", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return r.Timestamp })},
	{"start_ns", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.Start) })},
	{"lag_ns", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.Lag) })},
	{"input_blocks", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.InputBlocks })},
	{"exist_blocks", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.ExistBlocks })},
	{"hit_blocks", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.HitBlocks })},
	{"infinite_hit_blocks", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.InfiniteHitBlocks })},
	{"put_blocks", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.PutBlocks })},
	{"bytes_read", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return r.BytesRead })},
	{"bytes_written", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return r.BytesWritten })},
	{"exist_latency_ns", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.ExistLatency) })},
	{"get_latency_ns", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.GetLatency) })},
	{"put_latency_ns", arrow.PrimitiveTypes.Int64, i64(func(r *RequestResult) int64 { return int64(r.PutLatency) })},
	{"exist_failed", arrow.FixedWidthTypes.Boolean, func(b array.Builder, r *RequestResult) {
		b.(*array.BooleanBuilder).Append(r.ExistFailed)
	}},
	{"failed_gets", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.FailedGets })},
	{"failed_puts", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.FailedPuts })},
	{"corrupt", arrow.PrimitiveTypes.Int32, i32(func(r *RequestResult) int { return r.Corrupt })},
	{"err", arrow.BinaryTypes.String, func(b array.Builder, r *RequestResult) {
		b.(*array.StringBuilder).Append(r.Err)
	}},
}

func i64(f func(*RequestResult) int64) func(array.Builder, *RequestResult) {
	return func(b array.Builder, r *RequestResult) { b.(*array.Int64Builder).Append(f(r)) }
}

func i32(f func(*RequestResult) int) func(array.Builder, *RequestResult) {
	return func(b array.Builder, r *RequestResult) { b.(*array.Int32Builder).Append(int32(f(r))) }
}

var parquetSchema = func() *arrow.Schema {
	fields := make([]arrow.Field, len(columns))
	for i, c := range columns {
		fields[i] = arrow.Field{Name: c.name, Type: c.typ}
	}
	return arrow.NewSchema(fields, nil)
}()

// ParquetColumns returns the column names of WriteParquet's file, in
// order. Each is a field of RequestResult in snake case; times are in
// nanoseconds but timestamp_ms, the trace's, in milliseconds; err is empty
// for a request without error.
func ParquetColumns() []string {
	names := make([]string, len(columns))
	for i, c := range columns {
		names[i] = c.name
	}
	return names
}

// WriteParquet writes rs to a new Parquet file at path, one row per
// request, zstd-compressed, with the columns ParquetColumns.
func WriteParquet(path string, rs []RequestResult) (err error) {
	rec := parquetRecord(rs)
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

func parquetRecord(rs []RequestResult) arrow.Record {
	b := array.NewRecordBuilder(memory.DefaultAllocator, parquetSchema)
	defer b.Release()
	b.Reserve(len(rs))
	for i := range rs {
		for j, c := range columns {
			c.put(b.Field(j), &rs[i])
		}
	}
	return b.NewRecord()
}

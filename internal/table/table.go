// Package table writes rows of a Go type to Parquet (Arrow Go v17): a
// table is a list of typed columns, each a name and how to read its value
// from a row, so the schema and the rows cannot drift apart. Benchmarks
// and the simulator write their per-request results with it.
package table

import (
	"bufio"
	"errors"

	"github.com/apache/arrow/go/v17/arrow"
	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/memory"
	"github.com/apache/arrow/go/v17/parquet"
	"github.com/apache/arrow/go/v17/parquet/compress"
	"github.com/apache/arrow/go/v17/parquet/pqarrow"

	"github.com/mooncake-go/mooncake/internal/fileout"
)

// Column is one column of rows of type T.
type Column[T any] struct {
	Name string
	Type arrow.DataType
	put  func(array.Builder, *T)
}

// Int64 is a column of int64 values.
func Int64[T any](name string, f func(*T) int64) Column[T] {
	return Column[T]{name, arrow.PrimitiveTypes.Int64, func(b array.Builder, r *T) { b.(*array.Int64Builder).Append(f(r)) }}
}

// Int32 is a column of int values stored as int32.
func Int32[T any](name string, f func(*T) int) Column[T] {
	return Column[T]{name, arrow.PrimitiveTypes.Int32, func(b array.Builder, r *T) { b.(*array.Int32Builder).Append(int32(f(r))) }}
}

// Float64 is a column of float64 values.
func Float64[T any](name string, f func(*T) float64) Column[T] {
	return Column[T]{name, arrow.PrimitiveTypes.Float64, func(b array.Builder, r *T) { b.(*array.Float64Builder).Append(f(r)) }}
}

// Bool is a column of booleans.
func Bool[T any](name string, f func(*T) bool) Column[T] {
	return Column[T]{name, arrow.FixedWidthTypes.Boolean, func(b array.Builder, r *T) { b.(*array.BooleanBuilder).Append(f(r)) }}
}

// String is a column of strings.
func String[T any](name string, f func(*T) string) Column[T] {
	return Column[T]{name, arrow.BinaryTypes.String, func(b array.Builder, r *T) { b.(*array.StringBuilder).Append(f(r)) }}
}

// Table is the columns of a file, in order.
type Table[T any] []Column[T]

// Names returns the column names, in order.
func (t Table[T]) Names() []string {
	names := make([]string, len(t))
	for i, c := range t {
		names[i] = c.Name
	}
	return names
}

// Schema is the Arrow schema of the table.
func (t Table[T]) Schema() *arrow.Schema {
	fields := make([]arrow.Field, len(t))
	for i, c := range t {
		fields[i] = arrow.Field{Name: c.Name, Type: c.Type}
	}
	return arrow.NewSchema(fields, nil)
}

// Record builds the rows into an Arrow record; the caller releases it.
func (t Table[T]) Record(rows []T) arrow.Record {
	b := array.NewRecordBuilder(memory.DefaultAllocator, t.Schema())
	defer b.Release()
	b.Reserve(len(rows))
	for i := range rows {
		for j, c := range t {
			c.put(b.Field(j), &rows[i])
		}
	}
	return b.NewRecord()
}

// WriteParquet writes rows to a new zstd-compressed Parquet file at path,
// one row each.
func (t Table[T]) WriteParquet(path string, rows []T) error {
	rec := t.Record(rows)
	defer rec.Release()
	return fileout.Write(path, func(w *bufio.Writer) error {
		// A bufio.Writer is no io.Closer, so the Parquet writer leaves the
		// file to fileout.
		props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Zstd))
		pw, err := pqarrow.NewFileWriter(rec.Schema(), w, props, pqarrow.DefaultWriterProps())
		if err != nil {
			return err
		}
		if err := pw.Write(rec); err != nil {
			return errors.Join(err, pw.Close())
		}
		return pw.Close()
	})
}

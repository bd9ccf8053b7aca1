package table_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow/go/v17/arrow"
	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/memory"
	"github.com/apache/arrow/go/v17/parquet"
	"github.com/apache/arrow/go/v17/parquet/pqarrow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/table"
)

type row struct {
	id   int64
	n    int
	x    float64
	ok   bool
	name string
}

var rows = table.Table[row]{
	table.Int64("id", func(r *row) int64 { return r.id }),
	table.Int32("n", func(r *row) int { return r.n }),
	table.Float64("x", func(r *row) float64 { return r.x }),
	table.Bool("ok", func(r *row) bool { return r.ok }),
	table.String("name", func(r *row) string { return r.name }),
}

func TestWriteParquetRoundTrip(t *testing.T) {
	in := []row{{1, -2, 0.5, true, "a"}, {1 << 40, 7, -1e9, false, ""}, {3, 0, 2, true, "ünï"}}
	path := filepath.Join(t.TempDir(), "t.parquet")
	require.NoError(t, rows.WriteParquet(path, in))
	assert.Equal(t, []string{"id", "n", "x", "ok", "name"}, rows.Names())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	tbl, err := pqarrow.ReadTable(context.Background(), f, parquet.NewReaderProperties(mem), pqarrow.ArrowReadProperties{}, mem)
	require.NoError(t, err)
	defer tbl.Release()
	require.Equal(t, int64(len(in)), tbl.NumRows())
	for i, fld := range tbl.Schema().Fields() {
		assert.Equal(t, rows[i].Name, fld.Name)
		assert.True(t, arrow.TypeEqual(rows[i].Type, fld.Type), "%s: %v", fld.Name, fld.Type)
	}
	col := func(i int) any { return tbl.Column(i).Data().Chunk(0) }
	for i, r := range in {
		assert.Equal(t, r.id, col(0).(*array.Int64).Value(i))
		assert.Equal(t, int32(r.n), col(1).(*array.Int32).Value(i))
		assert.Equal(t, r.x, col(2).(*array.Float64).Value(i))
		assert.Equal(t, r.ok, col(3).(*array.Boolean).Value(i))
		assert.Equal(t, r.name, col(4).(*array.String).Value(i))
	}
}

func TestWriteParquetErrors(t *testing.T) {
	require.ErrorIs(t, rows.WriteParquet(filepath.Join(t.TempDir(), "no", "such", "dir.parquet"), nil), fs.ErrNotExist)
	// No rows is an empty file with the schema, not an error.
	require.NoError(t, rows.WriteParquet(filepath.Join(t.TempDir(), "empty.parquet"), nil))
}

package chaos

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/memory"
	"github.com/apache/arrow/go/v17/parquet"
	"github.com/apache/arrow/go/v17/parquet/pqarrow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The history's Parquet file holds every operation, by invocation, with
// what the checker needs.
func TestHistoryParquet(t *testing.T) {
	h := NewHistory()
	h.Add(Op{Client: 1, Kind: Get, Key: "k", Invoke: ms(20), Complete: ms(25), Result: Unknown, Err: "timeout"})
	h.Add(w(Upsert, 0, 7, 0, 10, OK))
	path := filepath.Join(t.TempDir(), "h.parquet")
	require.NoError(t, h.WriteParquet(path))

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	tbl, err := pqarrow.ReadTable(context.Background(), f, parquet.NewReaderProperties(mem), pqarrow.ArrowReadProperties{}, mem)
	require.NoError(t, err)
	defer tbl.Release()
	require.EqualValues(t, 2, tbl.NumRows())
	col := map[string]any{}
	for i, fld := range tbl.Schema().Fields() {
		col[fld.Name] = tbl.Column(i).Data().Chunk(0)
	}
	assert.Equal(t, OpColumns(), func() []string {
		var n []string
		for _, fld := range tbl.Schema().Fields() {
			n = append(n, fld.Name)
		}
		return n
	}())
	// Ordered by invocation: the upsert first.
	assert.Equal(t, "upsert", col["op"].(*array.String).Value(0))
	assert.EqualValues(t, 1, col["writer"].(*array.Int64).Value(0))
	assert.EqualValues(t, 7, col["version"].(*array.Int64).Value(0))
	assert.EqualValues(t, ms(10), col["complete_ns"].(*array.Int64).Value(0))
	assert.Equal(t, "ok", col["result"].(*array.String).Value(0))
	assert.Equal(t, "get", col["op"].(*array.String).Value(1))
	assert.Equal(t, "unknown", col["result"].(*array.String).Value(1))
	assert.Equal(t, "timeout", col["error"].(*array.String).Value(1))
	assert.EqualValues(t, 1, col["index"].(*array.Int64).Value(0), "the index is the order of recording")
}

package trace_test

import (
	"context"
	"encoding/xml"
	"errors"
	"image"
	"image/png"
	"io"
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

	"github.com/mooncake-go/mooncake/bench/trace"
)

// replayed is a small replay through a store too small for the trace, so
// that the hit ratio and its bound differ.
func replayed(t *testing.T) *trace.Result {
	t.Helper()
	res, err := trace.Replay(context.Background(), newMemStore(400),
		trace.Options{MaxRequests: 700, Concurrency: 2, BlockBytes: small})
	require.NoError(t, err)
	return res
}

func TestWriteParquet(t *testing.T) {
	res := replayed(t)
	path := filepath.Join(t.TempDir(), "replay.parquet")
	require.NoError(t, trace.WriteParquet(path, res.PerRequest))

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	tbl, err := pqarrow.ReadTable(context.Background(), f, parquet.NewReaderProperties(mem),
		pqarrow.ArrowReadProperties{}, mem)
	require.NoError(t, err)
	defer tbl.Release()

	require.Equal(t, int64(res.Requests), tbl.NumRows())
	var names []string
	for _, fld := range tbl.Schema().Fields() {
		names = append(names, fld.Name)
	}
	assert.Equal(t, trace.ParquetColumns(), names)

	// Columns hold what the requests did, row by row.
	col := func(name string) arrow.Array {
		idx := tbl.Schema().FieldIndices(name)
		require.Len(t, idx, 1, name)
		chunks := tbl.Column(idx[0]).Data().Chunks()
		require.Len(t, chunks, 1, name)
		return chunks[0]
	}
	index := col("index").(*array.Int64)
	hits := col("hit_blocks").(*array.Int32)
	bound := col("infinite_hit_blocks").(*array.Int32)
	get := col("get_latency_ns").(*array.Int64)
	errs := col("err").(*array.String)
	failed := col("exist_failed").(*array.Boolean)
	for i, r := range res.PerRequest {
		require.Equal(t, int64(r.Index), index.Value(i))
		require.Equal(t, int32(r.HitBlocks), hits.Value(i))
		require.Equal(t, int32(r.InfiniteHitBlocks), bound.Value(i))
		require.Equal(t, int64(r.GetLatency), get.Value(i))
		require.Equal(t, r.Err, errs.Value(i))
		require.Equal(t, r.ExistFailed, failed.Value(i))
	}

	// An empty replay is an empty table, not an error.
	empty := filepath.Join(t.TempDir(), "empty.parquet")
	require.NoError(t, trace.WriteParquet(empty, nil))
	g, err := os.Open(empty)
	require.NoError(t, err)
	defer g.Close()
	tbl2, err := pqarrow.ReadTable(context.Background(), g, parquet.NewReaderProperties(mem),
		pqarrow.ArrowReadProperties{}, mem)
	require.NoError(t, err)
	defer tbl2.Release()
	assert.Zero(t, tbl2.NumRows())

	// A path that cannot be created is an error.
	require.Error(t, trace.WriteParquet(filepath.Join(t.TempDir(), "no", "such"), res.PerRequest))
}

func TestWritePlot(t *testing.T) {
	res := replayed(t)
	for _, tc := range []struct {
		name   string
		rs     []trace.RequestResult
		legend []string
	}{
		// A replay with hits and gets; request indexes labelled every
		// 100.
		{"replay", res.PerRequest, []string{"actual", "infinite-cache bound", "each get", "median per 3 requests",
			"100", "200", "300", "400", "500", "600"}},
		// Nothing to draw still draws the axes.
		{"empty", nil, nil},
		// One request without a get.
		{"one", res.PerRequest[:1], []string{"actual", "infinite-cache bound"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "replay.png")
			require.NoError(t, trace.WritePlot(path, tc.rs))
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			img, err := png.Decode(f)
			require.NoError(t, err)
			assert.Equal(t, image.Rect(0, 0, 1000, 720), img.Bounds())

			// The SVG beside it has the axes' titles, with units, and
			// the legends.
			texts := svgTexts(t, filepath.Join(filepath.Dir(path), "replay.svg"))
			for _, s := range append([]string{"request index (trace order)", "blocks hit / blocks asked",
				"BatchGet latency (ms)"}, tc.legend...) {
				assert.Contains(t, texts, s)
			}
			if tc.legend == nil {
				assert.NotContains(t, texts, "actual")
			}
		})
	}
}

// svgTexts are the texts of the SVG document at path, which must be
// well formed.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	d := xml.NewDecoder(f)
	var texts []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return texts
		}
		require.NoError(t, err)
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "text" {
			var s string
			require.NoError(t, d.DecodeElement(&s, &el))
			texts = append(texts, s)
		}
	}
}

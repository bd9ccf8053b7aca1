// Command benchplot turns e2e/torch/bench_pg.py's JSON rows into Parquet
// (internal/table) and a PNG (internal/plot): bus bandwidth against size,
// one panel per collective, mooncake-cpu and gloo as two lines, and the
// ratio of their times per size.
//
//	go run ./e2e/torch/benchplot -in build/bench/pg.json -out build/bench/pg
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/mooncake-go/mooncake/internal/plot"
	"github.com/mooncake-go/mooncake/internal/table"
)

// row is one (collective, backend, size) median, as bench_pg.py writes it.
type row struct {
	Op        string  `json:"op"`
	Backend   string  `json:"backend"`
	Bytes     int64   `json:"bytes"`
	Ranks     int     `json:"ranks"`
	Repeats   int     `json:"repeats"`
	Iters     int     `json:"iters"`
	MedianS   float64 `json:"median_s"`
	MinS      float64 `json:"min_s"`
	MaxS      float64 `json:"max_s"`
	BusBWGBps float64 `json:"busbw_gbps"`
}

var columns = table.Table[row]{
	table.String("op", func(r *row) string { return r.Op }),
	table.String("backend", func(r *row) string { return r.Backend }),
	table.Int64("bytes", func(r *row) int64 { return r.Bytes }),
	table.Int32("ranks", func(r *row) int { return r.Ranks }),
	table.Int32("repeats", func(r *row) int { return r.Repeats }),
	table.Int32("iters", func(r *row) int { return r.Iters }),
	table.Float64("median_s", func(r *row) float64 { return r.MedianS }),
	table.Float64("min_s", func(r *row) float64 { return r.MinS }),
	table.Float64("max_s", func(r *row) float64 { return r.MaxS }),
	table.Float64("busbw_gbps", func(r *row) float64 { return r.BusBWGBps }),
}

func main() {
	in := flag.String("in", "build/bench/pg.json", "bench_pg.py's JSON rows")
	out := flag.String("out", "build/bench/pg", "output path without extension (.parquet and .png are added)")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var rows []row
	if err := json.Unmarshal(b, &rows); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("%s: no rows", in)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Bytes < rows[j].Bytes })
	if err := columns.WriteParquet(out+".parquet", rows); err != nil {
		return err
	}
	var panels []*plot.Panel
	for _, op := range []string{"all_reduce", "all_gather"} {
		panels = append(panels, panel(op, rows))
	}
	return plot.Save(out+".png", panels...)
}

// panel draws one collective's bus bandwidth per backend against size.
func panel(op string, rows []row) *plot.Panel {
	p := plot.New(fmt.Sprintf("%s, %d local ranks: bus bandwidth", op, rows[0].Ranks), "size (bytes)", "bus bandwidth (GB/s)")
	plot.Log(&p.X)
	for i, backend := range []string{"mooncake-cpu", "gloo"} {
		var pts plot.XYs
		for _, r := range rows {
			if r.Op == op && r.Backend == backend {
				pts = append(pts, plot.XY{X: float64(r.Bytes), Y: r.BusBWGBps})
			}
		}
		if len(pts) > 0 {
			l := plot.Line(pts, plot.Colour(i))
			p.Add(l, plot.Dots(pts, plot.Colour(i)))
			p.Legend.Add(backend, l)
		}
	}
	return p
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"

	"github.com/mooncake-go/mooncake/internal/plot"
	"github.com/mooncake-go/mooncake/internal/table"
)

func numCPU() int { return runtime.NumCPU() }

// row is one point's median over its runs, the Parquet's rows.
//
//   - store: Op put or get at Hosts hosts; Median aggregate MB/s; Ideal
//     Hosts times one link's rate; Ratio the scaling efficiency.
//   - p2p: Op swarm or seed-only to Hosts receivers; Median seconds; Ideal
//     size over link rate; Ratio seed-only's time over this one's.
//   - master: Op exists or replicas, Hosts clients; Median calls per
//     second; CPUus the master's CPU per call.
//   - stripes: Op striped or unstriped, Hosts the pieces (each on a host
//     of its own); Median the get's MB/s; Ideal those hosts' links
//     summed; Ratio Median over Ideal. Op striped/unstriped: Median the
//     one's median over the other's, unit x.
type row struct {
	Phase  string  `json:"phase"`
	Op     string  `json:"op"`
	Hosts  int     `json:"hosts"`
	Runs   int     `json:"runs"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Unit   string  `json:"unit"`
	Ideal  float64 `json:"ideal"`
	Ratio  float64 `json:"ratio"`
	CPUus  float64 `json:"cpu_us_per_call"`
}

var columns = table.Table[row]{
	table.String("phase", func(r *row) string { return r.Phase }),
	table.String("op", func(r *row) string { return r.Op }),
	table.Int32("hosts", func(r *row) int { return r.Hosts }),
	table.Int32("runs", func(r *row) int { return r.Runs }),
	table.Float64("median", func(r *row) float64 { return r.Median }),
	table.Float64("min", func(r *row) float64 { return r.Min }),
	table.Float64("max", func(r *row) float64 { return r.Max }),
	table.String("unit", func(r *row) string { return r.Unit }),
	table.Float64("ideal", func(r *row) float64 { return r.Ideal }),
	table.Float64("ratio", func(r *row) float64 { return r.Ratio }),
	table.Float64("cpu_us_per_call", func(r *row) float64 { return r.CPUus }),
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func point(phase, op string, hosts int, unit string, xs []float64) row {
	return row{Phase: phase, Op: op, Hosts: hosts, Runs: len(xs), Median: median(xs),
		Min: slices.Min(xs), Max: slices.Max(xs), Unit: unit}
}

// summarise reduces the runs to their medians.
func summarise(res *results) []row {
	var out []row
	link := float64(res.Options.Rate) / 8 / 1e6 // MB/s
	for _, op := range []string{"put", "get"} {
		one := 0.0
		for _, n := range res.Options.Hosts {
			var xs []float64
			for _, r := range res.Store {
				if r.Op == op && r.Hosts == n {
					xs = append(xs, r.MBps)
				}
			}
			if len(xs) == 0 {
				continue
			}
			p := point("store", op, n, "MB/s", xs)
			p.Ideal = float64(n) * link
			if n == 1 {
				one = p.Median
			}
			if one > 0 {
				p.Ratio = p.Median / (float64(n) * one)
			}
			out = append(out, p)
		}
	}
	seedOnly := 0.0
	for _, way := range []string{"seed-only", "swarm"} {
		var xs []float64
		for _, r := range res.P2P {
			if r.Way == way {
				xs = append(xs, r.Seconds)
			}
		}
		if len(xs) == 0 {
			continue
		}
		p := point("p2p", way, res.Options.P2PRecv, "s", xs)
		p.Ideal = float64(res.Options.P2PSize) * 8 / float64(res.Options.Rate)
		if way == "seed-only" {
			seedOnly = p.Median
		}
		if p.Median > 0 {
			p.Ratio = seedOnly / p.Median
		}
		out = append(out, p)
	}
	for _, op := range []string{"exists", "replicas"} {
		var xs, cpu []float64
		for _, r := range res.Master {
			if r.Op == op {
				xs, cpu = append(xs, r.CallsPerS), append(cpu, r.CPUPerCall)
			}
		}
		if len(xs) == 0 {
			continue
		}
		p := point("master", op, res.Options.MetaCli, "calls/s", xs)
		p.CPUus = median(cpu)
		out = append(out, p)
	}
	return append(out, stripeRows(res)...)
}

// stripeRows are the stripes phase's medians, and striped over unstriped.
func stripeRows(res *results) []row {
	var out []row
	link := float64(res.Options.Rate) / 8 / 1e6 // MB/s
	med := map[string]float64{}
	for _, way := range []string{"striped", "unstriped"} {
		var xs []float64
		pieces := 0
		for _, r := range res.Stripes {
			if r.Way == way {
				xs, pieces = append(xs, r.MBps), r.Pieces
			}
		}
		if len(xs) == 0 {
			continue
		}
		p := point("stripes", way, pieces, "MB/s", xs)
		p.Ideal = float64(pieces) * link
		p.Ratio = p.Median / p.Ideal
		med[way] = p.Median
		out = append(out, p)
	}
	if med["striped"] > 0 && med["unstriped"] > 0 {
		x := med["striped"] / med["unstriped"]
		out = append(out, row{Phase: "stripes", Op: "striped/unstriped", Hosts: res.Options.StripeN,
			Runs: len(res.Stripes) / 2, Median: x, Min: x, Max: x, Unit: "x", Ideal: float64(res.Options.StripeN), Ratio: x / float64(res.Options.StripeN)})
	}
	return out
}

// plotFiles turns out.json into out.parquet (the summary) and out.png.
func plotFiles(out string) error {
	b, err := os.ReadFile(out + ".json")
	if err != nil {
		return err
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s.json: %w", out, err)
	}
	if len(res.Summary) == 0 {
		return fmt.Errorf("%s.json: no summary rows", out)
	}
	if err := columns.WriteParquet(out+".parquet", res.Summary); err != nil {
		return err
	}
	var panels []*plot.Panel
	if p := throughputPanel(&res); p != nil {
		panels = append(panels, p, efficiencyPanel(&res))
	}
	if p := p2pPanel(&res); p != nil {
		panels = append(panels, p)
	}
	if p := stripesPanel(&res); p != nil {
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return nil
	}
	return plot.Save(out+".png", panels...)
}

func storeRows(res *results, op string) []row {
	var out []row
	for _, r := range res.Summary {
		if r.Phase == "store" && r.Op == op {
			out = append(out, r)
		}
	}
	return out
}

// throughputPanel: aggregate put and get MB/s against hosts, and the
// links' sum.
func throughputPanel(res *results) *plot.Panel {
	p := plot.New(fmt.Sprintf("store, %s objects, links of %s: aggregate throughput", size(int64(res.Options.Value)), rate(res.Options.Rate)),
		"hosts", "MB/s (1e6 B/s of values)")
	var ideal plot.XYs
	drawn := false
	for i, op := range []string{"put", "get"} {
		var pts plot.XYs
		for _, r := range storeRows(res, op) {
			pts = append(pts, plot.XY{X: float64(r.Hosts), Y: r.Median})
			if i == 0 {
				ideal = append(ideal, plot.XY{X: float64(r.Hosts), Y: r.Ideal})
			}
		}
		if len(pts) > 0 {
			l := plot.Line(pts, plot.Colour(i))
			p.Add(l, plot.Dots(pts, plot.Colour(i)))
			p.Legend.Add(op, l)
			drawn = true
		}
	}
	if !drawn {
		return nil
	}
	if len(ideal) > 0 {
		l := plot.Dashed(ideal, plot.Colour(2))
		p.Add(l)
		p.Legend.Add("hosts x link rate", l)
	}
	return p
}

// efficiencyPanel: aggregate over hosts times one host's figure.
func efficiencyPanel(res *results) *plot.Panel {
	p := plot.New("store: scaling efficiency", "hosts", "aggregate / (hosts x one host)")
	for i, op := range []string{"put", "get"} {
		var pts plot.XYs
		for _, r := range storeRows(res, op) {
			pts = append(pts, plot.XY{X: float64(r.Hosts), Y: r.Ratio})
		}
		if len(pts) > 0 {
			l := plot.Line(pts, plot.Colour(i))
			p.Add(l, plot.Dots(pts, plot.Colour(i)))
			p.Legend.Add(op, l)
		}
	}
	p.Legend.Add("target 0.85", plot.HLine(p, 0.85, plot.Colour(3)))
	p.Y.Min = 0
	return p
}

// p2pPanel: the fan-out's time, swarming and from the seed alone, and the
// ideal.
func p2pPanel(res *results) *plot.Panel {
	var vals []float64
	var cats []string
	for _, r := range res.Summary {
		if r.Phase == "p2p" {
			cats, vals = append(cats, r.Op), append(vals, r.Median)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	cats = append(cats, "ideal")
	vals = append(vals, float64(res.Options.P2PSize)*8/float64(res.Options.Rate))
	p := plot.New(fmt.Sprintf("P2P store: %s from one seed to %d hosts", size(res.Options.P2PSize), res.Options.P2PRecv), "", "seconds")
	if err := plot.Bars(p, cats, [][]float64{vals}, []string{"time"}, func(v float64) string { return fmt.Sprintf("%.1f s", v) }); err != nil {
		return nil
	}
	return p
}

// stripesPanel: the get's MB/s striped, unstriped, and the ideal.
func stripesPanel(res *results) *plot.Panel {
	var vals []float64
	var cats []string
	for _, r := range res.Summary {
		if r.Phase == "stripes" && r.Unit == "MB/s" {
			cats, vals = append(cats, fmt.Sprintf("%s (%d hosts)", r.Op, r.Hosts)), append(vals, r.Median)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	cats = append(cats, fmt.Sprintf("ideal (%d hosts)", res.Options.StripeN))
	vals = append(vals, float64(res.Options.StripeN)*float64(res.Options.Rate)/8/1e6)
	p := plot.New(fmt.Sprintf("store: one get of %s from stripes on %d hosts, links of %s", size(res.Options.StripeSz), res.Options.StripeN, rate(res.Options.Rate)), "", "MB/s")
	if err := plot.Bars(p, cats, [][]float64{vals}, []string{"get"}, func(v float64) string { return fmt.Sprintf("%.1f", v) }); err != nil {
		return nil
	}
	return p
}

package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/internal/plot"
)

// cdf is the empirical distribution of v as a staircase of points,
// starting at the smallest value (not at 0, so that a log axis can show
// it).
func cdf(v []float64) plot.XYs {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return nil
	}
	pts := make(plot.XYs, 0, len(s)+1)
	pts = append(pts, plot.XY{X: s[0], Y: 0})
	for i, x := range s {
		pts = append(pts, plot.XY{X: x, Y: float64(i+1) / float64(len(s))})
	}
	return pts
}

// WritePlot draws the distributions of TTFT (above) and TBT (below) of
// the admitted requests of one or more runs, as a PNG at path and an SVG
// beside it. Each X axis is logarithmic where its values span decades.
func WritePlot(path string, rs ...*Result) error {
	p := plot.New("TTFT of the admitted requests", "TTFT (s)", "requests (CDF)")
	q := plot.New("TBT: mean of the longest 10% of a request's token intervals", "TBT (ms)", "requests (CDF)")
	plot.Percent(&p.Y)
	plot.Percent(&q.Y)
	for i, r := range rs {
		var ttft, tbt []float64
		for _, o := range r.Outcomes {
			if o.Rejected {
				continue
			}
			ttft = append(ttft, o.TTFT.Seconds())
			if o.OutputTokens > 1 {
				tbt = append(tbt, float64(o.TBT)/1e6)
			}
		}
		addLine(p, r.Config.Name(), cdf(ttft), i)
		addLine(q, r.Config.Name(), cdf(tbt), i)
	}
	return plot.Save(path, p, q)
}

// addLine adds pts to p as series i, named name in the legend, unless
// there are none.
func addLine(p *plot.Panel, name string, pts plot.XYs, i int) {
	if len(pts) == 0 {
		return
	}
	l := plot.Line(pts, plot.Colour(i))
	p.Add(l)
	p.Legend.Add(name, l)
}

// PlotFig5 draws the mean TTFT of each policy as bars (Fig. 5).
func PlotFig5(path string, rs []*Result) error {
	names := make([]string, len(rs))
	vals := make([]float64, len(rs))
	for i, r := range rs {
		s := r.Summary()
		names[i], vals[i] = s.Policy, s.TTFTMeanS
	}
	p := plot.New("mean TTFT by prefill policy", "prefill scheduling policy", "mean TTFT (s)")
	if err := plot.Bars(p, names, [][]float64{vals}, nil, func(v float64) string { return fmt.Sprintf("%.2f", v) }); err != nil {
		return err
	}
	return plot.Save(path, p)
}

// PlotFig9 draws the hit ratio against the cache capacity on a log axis,
// with the infinite-capacity bound dashed and the 3M-token local cache
// marked (Fig. 9).
func PlotFig9(path string, h HitCurve) error {
	pts := make(plot.XYs, len(h.Capacities))
	for i, cp := range h.Capacities {
		pts[i].X, pts[i].Y = float64(cp), h.Ratios[i]
	}
	p := plot.New("prefix-cache hit ratio vs LRU capacity", "cache capacity (tokens)", "hit ratio (prompt tokens reused)")
	plot.Log(&p.X)
	plot.Percent(&p.Y)
	l := plot.Line(pts, plot.Blue)
	d := plot.Dots(pts, plot.Blue)
	p.Add(l, d)
	p.Legend.Add("LRU", l, d)
	p.Legend.Add(fmt.Sprintf("infinite (%.1f%%)", 100*h.Infinite), plot.HLine(p, h.Infinite, plot.Orange))
	if x := float64(DefaultLocalTokens); x > pts[0].X && x < pts[len(pts)-1].X {
		p.Legend.Add("3M tokens (local DRAM)", plot.VLine(p, x, plot.LightGray))
	}
	return plot.Save(path, p)
}

// PlotFig10 draws the hit ratio and the mean prefill GPU time of the
// local- and global-cache runs side by side (Fig. 10).
func PlotFig10(path string, local, global *Result) error {
	l, g := local.Summary(), global.Summary()
	cats := []string{"local cache", "global cache"}
	p := plot.New("cache hit ratio", "prefix cache", "hit ratio (prompt tokens reused)")
	if err := plot.Bars(p, cats, [][]float64{{l.CacheHitRatio, g.CacheHitRatio}}, nil,
		func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }); err != nil {
		return err
	}
	plot.Percent(&p.Y)
	q := plot.New("mean prefill GPU time", "prefix cache", "mean prefill GPU time (s)")
	if err := plot.Bars(q, cats, [][]float64{{l.PrefillTimeMeanS, g.PrefillTimeMeanS}}, nil,
		func(v float64) string { return fmt.Sprintf("%.3f", v) }); err != nil {
		return err
	}
	return plot.Save(path, p, q)
}

// PlotFig1 draws the effective request ratio of each run against the TBT
// threshold, on a log axis (Fig. 1).
func PlotFig1(path string, names []string, rs []*Result, thresholds []time.Duration) error {
	p := plot.New("effective requests (TTFT within its SLO) vs TBT threshold", "TBT threshold (ms)",
		"effective requests")
	plot.Log(&p.X)
	plot.Percent(&p.Y)
	p.Y.Max = 1
	for i, r := range rs {
		pts := make(plot.XYs, len(thresholds))
		for j, t := range thresholds {
			pts[j].X, pts[j].Y = float64(t)/1e6, r.Effective(r.Config.TTFTSLO, t)
		}
		addLine(p, names[i], pts, i)
	}
	return plot.Save(path, p)
}

// PlotCapacity draws each system's capacity at target, relative to the
// first system's (Mooncake = 100%), against the TBT threshold on a log
// axis: the paper's Fig. 1.
func PlotCapacity(path string, names []string, c Capacity, target float64) error {
	p := plot.New(fmt.Sprintf("request capacity (highest load with >= %.0f%% effective requests) vs TBT threshold",
		100*target), "TBT threshold (ms)", fmt.Sprintf("capacity relative to %s", names[0]))
	plot.Log(&p.X)
	plot.Percent(&p.Y)
	p.Y.Max = 1
	for s := range names {
		pts := make(plot.XYs, 0, len(c.Thresholds))
		for t, th := range c.Thresholds {
			ref := c.At(0, t, target)
			if ref == 0 {
				continue
			}
			pts = append(pts, plot.XY{X: float64(th) / 1e6, Y: min(c.At(s, t, target)/ref, 1)})
		}
		addLine(p, names[s], pts, s)
	}
	return plot.Save(path, p)
}

// PlotReplicas draws the replicas of the prefix index over simulated
// time, one line per run: above, the mean replicas of the hot blocks
// (ReplicaSample.HotMean); below, the share of the blocks some prefill
// instance holds that two or more hold. Runs without samples (the coupled
// baseline) are left out.
func PlotReplicas(path string, rs ...*Result) error {
	hotN := DefaultHotBlocks
	if len(rs) > 0 {
		hotN = rs[0].Config.withDefaults().HotBlocks
	}
	p := plot.New(fmt.Sprintf("mean replicas of the %d most requested blocks", hotN), "simulated time (s)",
		"replicas per block")
	q := plot.New("cached blocks held by 2 or more prefill instances", "simulated time (s)", "share of cached blocks")
	p.X.Min, q.X.Min, p.Y.Min = 0, 0, 0
	plot.Percent(&q.Y)
	n := 0
	for _, r := range rs {
		if len(r.Replicas) == 0 {
			continue
		}
		var h, m plot.XYs
		for _, s := range r.Replicas {
			t := s.At.Seconds()
			h = append(h, plot.XY{X: t, Y: s.HotMean})
			share := 0.0
			if held := s.Held(); held > 0 && len(s.Blocks) > 1 {
				share = float64(held-s.Blocks[1]) / float64(held)
			}
			m = append(m, plot.XY{X: t, Y: share})
		}
		addLine(p, r.Config.Name(), h, n)
		addLine(q, r.Config.Name(), m, n)
		n++
	}
	return plot.Save(path, p, q)
}

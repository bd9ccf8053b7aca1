package sim

import (
	"fmt"
	"image/color"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/internal/hist"
	"github.com/mooncake-go/mooncake/internal/plot"
)

func colours(n int) []color.RGBA {
	out := make([]color.RGBA, n)
	for i := range out {
		out[i] = plot.Palette[i%len(plot.Palette)]
	}
	return out
}

// cdf is the empirical distribution of v as polyline points, x clipped at
// ceil.
func cdf(v []float64, ceil float64) [][2]float64 {
	s := slices.Sorted(slices.Values(v))
	pts := make([][2]float64, 0, len(s)+1)
	pts = append(pts, [2]float64{0, 0})
	for i, x := range s {
		pts = append(pts, [2]float64{min(x, ceil), float64(i+1) / float64(len(s))})
	}
	return pts
}

// WritePlot draws the distributions of TTFT (above) and TBT (below) of
// the admitted requests of one or more runs, as a PNG at path.
func WritePlot(path string, rs ...*Result) error {
	c := plot.NewCanvas(plot.Width, plot.TallHeight)
	names := make([]string, len(rs))
	ttft := make([][]float64, len(rs))
	tbt := make([][]float64, len(rs))
	var allTTFT, allTBT []float64
	for i, r := range rs {
		names[i] = r.Config.Name()
		for _, o := range r.Outcomes {
			if o.Rejected {
				continue
			}
			ttft[i] = append(ttft[i], o.TTFT.Seconds())
			if o.OutputTokens > 1 {
				tbt[i] = append(tbt[i], float64(o.TBT)/1e6)
			}
		}
		allTTFT = append(allTTFT, ttft[i]...)
		allTBT = append(allTBT, tbt[i]...)
	}
	ceilT := plot.NiceCeil(max(hist.NearestRank(allTTFT, 0.99), 1e-3))
	ceilB := plot.NiceCeil(max(hist.NearestRank(allTBT, 0.99), 1e-3))
	p := plot.Upper()
	p.XMax, p.YMax = ceilT, 1
	p.Axes(c, "CDF of TTFT (s), admitted requests", plot.Percent)
	q := plot.Lower()
	q.XMax, q.YMax = ceilB, 1
	q.Axes(c, "CDF of TBT (ms): mean of the longest 10% of a request's token intervals", plot.Percent)
	cols := colours(len(rs))
	for i := range rs {
		p.Polyline(c, cdf(ttft[i], ceilT), cols[i])
		q.Polyline(c, cdf(tbt[i], ceilB), cols[i])
	}
	c.Legend(p.X1-260, p.Y1-16*len(rs), names, cols)
	return c.Save(path)
}

// PlotFig5 draws the mean TTFT of each policy as bars (Fig. 5).
func PlotFig5(path string, rs []*Result) error {
	c := plot.NewCanvas(plot.Width, plot.ShortHeight)
	names := make([]string, len(rs))
	vals := make([]float64, len(rs))
	top := 0.0
	for i, r := range rs {
		s := r.Summary()
		names[i], vals[i] = s.Policy, s.TTFTMeanS
		top = max(top, vals[i])
	}
	p := plot.Single()
	p.Categories, p.YMax = names, plot.NiceCeil(max(top*1.15, 0.1))
	p.Axes(c, "mean TTFT (s) by prefill policy", plot.Plain)
	p.Bars(c, [][]float64{vals}, func(v float64) string { return fmt.Sprintf("%.2f", v) })
	return c.Save(path)
}

// PlotFig9 draws the hit ratio against the cache capacity, with the
// infinite-capacity bound dashed and the 3M-token local cache marked
// (Fig. 9).
func PlotFig9(path string, h HitCurve) error {
	c := plot.NewCanvas(plot.Width, plot.ShortHeight)
	pts := make([][2]float64, len(h.Capacities))
	for i, cp := range h.Capacities {
		pts[i] = [2]float64{float64(cp), h.Ratios[i]}
	}
	p := plot.Single()
	p.LogX, p.XMin, p.XMax = true, float64(h.Capacities[0]), float64(h.Capacities[len(h.Capacities)-1])
	p.YMax = plot.NiceCeil(max(h.Infinite*1.2, 0.01))
	p.Axes(c, "prefix-cache hit ratio vs LRU capacity (tokens)", plot.Percent)
	p.HLine(c, h.Infinite, plot.Orange)
	if x := float64(DefaultLocalTokens); x > p.XMin && x < p.XMax {
		c.DashedLine(p.PX(x), p.Y0, p.PX(x), p.Y1, plot.LightGray)
	}
	p.Polyline(c, pts, plot.Blue)
	for _, pt := range pts {
		c.Dot(p.PX(pt[0])-1, p.PY(pt[1])-1, plot.Blue)
	}
	c.Legend(p.X0+10, p.Y0+16, []string{"LRU", fmt.Sprintf("infinite (%.1f%%)", 100*h.Infinite), "3M tokens (local DRAM)"},
		[]color.RGBA{plot.Blue, plot.Orange, plot.LightGray})
	return c.Save(path)
}

// PlotFig10 draws the hit ratio and the mean prefill GPU time of the
// local- and global-cache runs side by side (Fig. 10).
func PlotFig10(path string, local, global *Result) error {
	c := plot.NewCanvas(plot.Width, plot.TallHeight)
	l, g := local.Summary(), global.Summary()
	cats := []string{"local cache", "global cache"}
	p := plot.Upper()
	p.Categories, p.YMax = cats, plot.NiceCeil(max(l.CacheHitRatio, g.CacheHitRatio)*1.2+1e-3)
	p.Axes(c, "cache hit ratio", plot.Percent)
	p.Bars(c, [][]float64{{l.CacheHitRatio, g.CacheHitRatio}}, plot.Percent)
	q := plot.Lower()
	q.Categories, q.YMax = cats, plot.NiceCeil(max(l.PrefillTimeMeanS, g.PrefillTimeMeanS)*1.2+1e-3)
	q.Axes(c, "mean prefill GPU time (s)", plot.Plain)
	q.Bars(c, [][]float64{{l.PrefillTimeMeanS, g.PrefillTimeMeanS}}, func(v float64) string {
		return fmt.Sprintf("%.3f", v)
	})
	return c.Save(path)
}

// PlotFig1 draws the effective request ratio of each run against the TBT
// threshold, on a log axis (Fig. 1).
func PlotFig1(path string, names []string, rs []*Result, thresholds []time.Duration) error {
	c := plot.NewCanvas(plot.Width, plot.ShortHeight)
	p := plot.Single()
	p.LogX, p.XMin, p.XMax, p.YMax = true, float64(thresholds[0])/1e6, float64(thresholds[len(thresholds)-1])/1e6, 1
	p.Axes(c, "effective request ratio vs TBT threshold (ms), TTFT <= SLO", plot.Percent)
	cols := colours(len(rs))
	for i, r := range rs {
		pts := make([][2]float64, len(thresholds))
		for j, t := range thresholds {
			pts[j] = [2]float64{float64(t) / 1e6, r.Effective(r.Config.TTFTSLO, t)}
		}
		p.Polyline(c, pts, cols[i])
	}
	c.Legend(p.X1-260, p.Y1-16*len(rs), names, cols)
	return c.Save(path)
}

// PlotCapacity draws each system's capacity at target, relative to the
// first system's (Mooncake = 100%), against the TBT threshold on a log
// axis: the paper's Fig. 1.
func PlotCapacity(path string, names []string, c Capacity, target float64) error {
	cv := plot.NewCanvas(plot.Width, plot.ShortHeight)
	p := plot.Single()
	p.LogX, p.XMin, p.XMax, p.YMax = true, float64(c.Thresholds[0])/1e6, float64(c.Thresholds[len(c.Thresholds)-1])/1e6, 1
	p.Axes(cv, fmt.Sprintf("request capacity (highest load with >= %.0f%% effective) relative to %s, vs TBT threshold (ms)",
		100*target, names[0]), plot.Percent)
	cols := colours(len(names))
	for s := range names {
		pts := make([][2]float64, 0, len(c.Thresholds))
		for t, th := range c.Thresholds {
			ref := c.At(0, t, target)
			if ref == 0 {
				continue
			}
			pts = append(pts, [2]float64{float64(th) / 1e6, min(c.At(s, t, target)/ref, 1)})
		}
		p.Polyline(cv, pts, cols[s])
	}
	cv.Legend(p.X1-260, p.Y1-16*len(names), names, cols)
	return cv.Save(path)
}

// PlotReplicas draws the replicas of the prefix index over simulated
// time, one line per run: above, the mean replicas of the hot blocks
// (ReplicaSample.HotMean); below, the share of the blocks some prefill
// instance holds that two or more hold. Runs without samples (the coupled
// baseline) are left out.
func PlotReplicas(path string, rs ...*Result) error {
	c := plot.NewCanvas(plot.Width, plot.TallHeight)
	var names []string
	var hot, multi [][][2]float64
	tMax, hotMax, multiMax := 1.0, 1.0, 0.01
	for _, r := range rs {
		if len(r.Replicas) == 0 {
			continue
		}
		var h, m [][2]float64
		for _, s := range r.Replicas {
			t := s.At.Seconds()
			tMax, hotMax = max(tMax, t), max(hotMax, s.HotMean)
			h = append(h, [2]float64{t, s.HotMean})
			share := 0.0
			if held := s.Held(); held > 0 && len(s.Blocks) > 1 {
				share = float64(held-s.Blocks[1]) / float64(held)
			}
			multiMax = max(multiMax, share)
			m = append(m, [2]float64{t, share})
		}
		names, hot, multi = append(names, r.Config.Name()), append(hot, h), append(multi, m)
	}
	hotN := DefaultHotBlocks
	if len(rs) > 0 {
		hotN = rs[0].Config.withDefaults().HotBlocks
	}
	xMax := plot.NiceCeil(tMax)
	p := plot.Upper()
	p.XMax, p.YMax = xMax, plot.NiceCeil(hotMax*1.1)
	p.Axes(c, fmt.Sprintf("mean replicas of the %d most requested blocks vs simulated time (s)", hotN), plot.Plain)
	q := plot.Lower()
	q.XMax, q.YMax = xMax, min(plot.NiceCeil(multiMax*1.2), 1)
	q.Axes(c, "share of cached blocks held by 2 or more prefill instances vs simulated time (s)", plot.Percent)
	cols := colours(len(names))
	for i := range names {
		p.Polyline(c, hot[i], cols[i])
		q.Polyline(c, multi[i], cols[i])
	}
	c.Legend(p.X1-260, p.Y0+16, names, cols)
	return c.Save(path)
}

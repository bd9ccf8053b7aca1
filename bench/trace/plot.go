package trace

import (
	"fmt"
	"slices"

	"github.com/mooncake-go/mooncake/internal/plot"
)

// plotWidth is the width of the figure's data area in windows of
// requests: the latency panel's median is over Len(rs)/plotWidth
// requests, a few pixels wide.
const plotWidth = 200

// WritePlot draws rs as a PNG at path and an SVG beside it: above, the
// cumulative hit ratio against the request index, actual and
// infinite-cache bound; below, the latency of every BatchGet (grey dots,
// none left out; the axis is logarithmic where they span decades) and
// its median over windows of requests.
func WritePlot(path string, rs []RequestResult) error {
	return plot.Save(path, hitPanel(rs), latencyPanel(rs))
}

// hitPanel draws the cumulative hit ratios.
func hitPanel(rs []RequestResult) *plot.Panel {
	p := plot.New("cumulative hit ratio", "request index (trace order)", "blocks hit / blocks asked")
	plot.Percent(&p.Y)
	p.X.Min = 0
	var blocks, hits, bound float64
	actual := make(plot.XYs, 0, len(rs))
	infinite := make(plot.XYs, 0, len(rs))
	for i, r := range rs {
		blocks += float64(r.InputBlocks)
		hits += float64(r.HitBlocks)
		bound += float64(r.InfiniteHitBlocks)
		if blocks == 0 {
			continue
		}
		actual = append(actual, plot.XY{X: float64(i), Y: hits / blocks})
		infinite = append(infinite, plot.XY{X: float64(i), Y: bound / blocks})
	}
	if len(actual) > 0 {
		a, b := plot.Line(actual, plot.Blue), plot.Line(infinite, plot.Orange)
		p.Add(b, a)
		p.Legend.Add("actual", a)
		p.Legend.Add("infinite-cache bound", b)
	}
	return p
}

// latencyPanel draws every get's latency, in milliseconds, and their
// median over windows of requests.
func latencyPanel(rs []RequestResult) *plot.Panel {
	p := plot.New("BatchGet latency by request", "request index (trace order)", "BatchGet latency (ms)")
	p.X.Min = 0
	var lat plot.XYs
	for i, r := range rs {
		if r.ExistBlocks > 0 {
			lat = append(lat, plot.XY{X: float64(i), Y: float64(r.GetLatency) / 1e6})
		}
	}
	if len(lat) == 0 {
		return p
	}
	window := max(len(rs)/plotWidth, 1)
	var med plot.XYs
	for lo := 0; lo < len(lat); {
		hi := lo
		for hi < len(lat) && int(lat[hi].X)/window == int(lat[lo].X)/window {
			hi++
		}
		vs := make([]float64, 0, hi-lo)
		for _, pt := range lat[lo:hi] {
			vs = append(vs, pt.Y)
		}
		slices.Sort(vs)
		x := float64(int(lat[lo].X)/window*window + window/2)
		med = append(med, plot.XY{X: x, Y: vs[len(vs)/2]})
		lo = hi
	}
	d, m := plot.Dots(lat, plot.LightGray), plot.Line(med, plot.Blue)
	p.Add(d, m)
	p.Legend.Add("each get", d)
	p.Legend.Add(fmt.Sprintf("median per %d requests", window), m)
	return p
}

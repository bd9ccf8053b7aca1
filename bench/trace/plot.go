package trace

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"github.com/mooncake-go/mooncake/internal/plot"
)

// WritePlot draws rs as a PNG at path: above, the cumulative hit ratio
// against the request index, actual and infinite-cache bound; below, the
// latency of every BatchGet (grey dots, clipped at the 99.5th percentile)
// and its median over windows of requests.
func WritePlot(path string, rs []RequestResult) error {
	return drawPlot(rs).Save(path)
}

func drawPlot(rs []RequestResult) *plot.Canvas {
	c := plot.NewCanvas(plot.Width, plot.TallHeight)
	n := float64(max(len(rs), 1))

	// Cumulative hit ratios.
	var blocks, hits, bound float64
	actual := make([][2]float64, 0, len(rs))
	infinite := make([][2]float64, 0, len(rs))
	top := 0.0
	for i, r := range rs {
		blocks += float64(r.InputBlocks)
		hits += float64(r.HitBlocks)
		bound += float64(r.InfiniteHitBlocks)
		if blocks == 0 {
			continue
		}
		actual = append(actual, [2]float64{float64(i), hits / blocks})
		infinite = append(infinite, [2]float64{float64(i), bound / blocks})
		top = max(top, hits/blocks, bound/blocks)
	}
	p := plot.Upper()
	p.XMax, p.YMax = n, plot.NiceCeil(max(top*1.1, 0.01))
	p.Axes(c, "cumulative hit ratio (blocks hit / blocks asked)", func(v float64) string {
		return fmt.Sprintf("%g%%", math.Round(v*1000)/10)
	})
	p.Polyline(c, infinite, plot.Orange)
	p.Polyline(c, actual, plot.Blue)
	c.Legend(p.X0+10, p.Y0+16, []string{"actual", "infinite-cache bound"}, []color.RGBA{plot.Blue, plot.Orange})

	// Get latency, in milliseconds.
	var lat [][2]float64
	var ms []float64
	for i, r := range rs {
		if r.ExistBlocks > 0 {
			v := float64(r.GetLatency) / 1e6
			lat = append(lat, [2]float64{float64(i), v})
			ms = append(ms, v)
		}
	}
	sorted := slices.Sorted(slices.Values(ms))
	ceil := 1.0
	if len(sorted) > 0 {
		ceil = plot.NiceCeil(max(sorted[int(0.995*float64(len(sorted)-1))]*1.1, 1e-3))
	}
	q := plot.Lower()
	q.XMax, q.YMax = n, ceil
	q.Axes(c, "BatchGet latency (ms) by request", func(v float64) string { return fmt.Sprintf("%g", v) })
	for _, pt := range lat {
		x, y := q.PX(pt[0]), q.PY(min(pt[1], ceil))
		c.Dot(x, y, plot.LightGray)
	}
	// Median over windows of about 4 pixels.
	window := max(int(n)*4/(q.X1-q.X0), 1)
	var med [][2]float64
	for lo := 0; lo < len(lat); {
		hi := lo
		for hi < len(lat) && int(lat[hi][0])/window == int(lat[lo][0])/window {
			hi++
		}
		vs := make([]float64, 0, hi-lo)
		for _, pt := range lat[lo:hi] {
			vs = append(vs, pt[1])
		}
		slices.Sort(vs)
		x := float64(int(lat[lo][0])/window*window + window/2)
		med = append(med, [2]float64{x, min(vs[len(vs)/2], ceil)})
		lo = hi
	}
	q.Polyline(c, med, plot.Blue)
	c.Legend(q.X0+10, q.Y0+16, []string{"each get", fmt.Sprintf("median per %d requests", window)},
		[]color.RGBA{plot.LightGray, plot.Blue})
	c.Text(plot.Width/2-60, plot.TallHeight-12, "request index (trace order)", plot.Black)
	return c
}

package plot_test

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/plot"
)

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		hi   float64
		n    int
		want []float64
	}{
		// Steps of 1, 2 or 5 times a power of ten.
		{10, 5, []float64{0, 2, 4, 6, 8, 10}},
		{1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		// 0.3 prints as 0.3, not 0.30000000000000004.
		{0.3, 3, []float64{0, 0.1, 0.2, 0.3}},
		// The last tick may stop short of hi.
		{7, 2, []float64{0, 5}},
	} {
		assert.Equal(t, tc.want, plot.Ticks(tc.hi, tc.n), "Ticks(%g, %d)", tc.hi, tc.n)
	}
	// NiceCeil is a labelled round value at or above v.
	assert.Equal(t, 0.8, plot.NiceCeil(0.62), "steps of 0.2")
	assert.Equal(t, 20.0, plot.NiceCeil(19.65))
	assert.Equal(t, 1.0, plot.NiceCeil(1))
}

func TestPanelMapping(t *testing.T) {
	p := plot.Panel{X0: 100, Y0: 10, X1: 300, Y1: 110, XMax: 10, YMax: 1}
	assert.Equal(t, 100, p.PX(0))
	assert.Equal(t, 300, p.PX(10))
	assert.Equal(t, 110, p.PY(0), "y grows upwards")
	assert.Equal(t, 10, p.PY(1))
	// A logarithmic axis puts the decades evenly.
	l := plot.Panel{X0: 0, X1: 500, XMin: 1e4, XMax: 1e9, LogX: true, YMax: 1, Y1: 10}
	assert.Equal(t, 0, l.PX(1e4))
	assert.Equal(t, 100, l.PX(1e5))
	assert.Equal(t, 500, l.PX(1e9))
}

// count is the number of pixels of colour col.
func count(c *plot.Canvas, col color.RGBA) int {
	n := 0
	b := c.Img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if c.Img.RGBAAt(x, y) == col {
				n++
			}
		}
	}
	return n
}

func TestCharts(t *testing.T) {
	for _, tc := range []struct {
		name string
		draw func(c *plot.Canvas)
		want []color.RGBA // colours that must appear
	}{
		// A linear line chart with a dashed bound and a legend.
		{"lines", func(c *plot.Canvas) {
			p := plot.Panel{X0: 60, Y0: 30, X1: 380, Y1: 250, XMax: 4, YMax: 1}
			p.Axes(c, "title", plot.Percent)
			p.Polyline(c, [][2]float64{{0, 0}, {2, 0.5}, {4, 0.6}}, plot.Blue)
			p.HLine(c, 0.8, plot.Orange)
			c.Legend(p.X0+10, p.Y0+16, []string{"a"}, []color.RGBA{plot.Blue})
		}, []color.RGBA{plot.Black, plot.Grid, plot.Blue, plot.Orange}},
		// A log-x chart.
		{"log", func(c *plot.Canvas) {
			p := plot.Panel{X0: 60, Y0: 30, X1: 380, Y1: 250, XMin: 1e4, XMax: 1e9, LogX: true, YMax: 1}
			p.Axes(c, "hit ratio", plot.Percent)
			p.Polyline(c, [][2]float64{{1e4, 0.1}, {1e9, 0.4}}, plot.Green)
		}, []color.RGBA{plot.Black, plot.Grid, plot.Green}},
		// Two series of bars in three categories, NaN skipped.
		{"bars", func(c *plot.Canvas) {
			p := plot.Panel{X0: 60, Y0: 30, X1: 380, Y1: 250, YMax: 20, Categories: []string{"a", "b", "c"}}
			p.Axes(c, "TTFT (s)", plot.Plain)
			p.Bars(c, [][]float64{{1, 2, 30}, {3, 4, math.NaN()}}, plot.Plain)
		}, []color.RGBA{plot.Black, plot.Blue, plot.Orange}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := plot.NewCanvas(400, 280)
			tc.draw(c)
			for _, col := range tc.want {
				assert.Positive(t, count(c, col), "colour %v", col)
			}
			// The canvas encodes and saves as a PNG of its size.
			var buf bytes.Buffer
			require.NoError(t, c.Encode(&buf))
			img, err := png.Decode(&buf)
			require.NoError(t, err)
			assert.Equal(t, c.Img.Bounds(), img.Bounds())
			require.NoError(t, c.Save(filepath.Join(t.TempDir(), "c.png")))
		})
	}
	// A file that cannot be created is an error.
	require.Error(t, plot.NewCanvas(1, 1).Save(filepath.Join(t.TempDir(), "no", "such.png")))
}

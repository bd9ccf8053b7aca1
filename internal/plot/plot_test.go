package plot_test

import (
	"encoding/xml"
	"errors"
	"image"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gplot "gonum.org/v1/plot"

	"github.com/mooncake-go/mooncake/internal/plot"
)

// labels are the labels of ts, in order.
func labels(ts []gplot.Tick) []string {
	var out []string
	for _, tk := range ts {
		if tk.Label != "" {
			out = append(out, tk.Label)
		}
	}
	return out
}

func TestLinearTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []string
	}{
		// Request indexes: about six labels, written as integers (not
		// 2500.00, as gonum's DefaultTicks has them).
		{0, 2999, []string{"0", "500", "1000", "1500", "2000", "2500"}},
		// A range off 0: steps of 2, from the first multiple.
		{12.4, 27, []string{"14", "16", "18", "20", "22", "24", "26"}},
		// Ratios: 0.3 written as 0.3, not 0.30000000000000004.
		{0, 0.3, []string{"0", "0.05", "0.1", "0.15", "0.2", "0.25", "0.3"}},
		// Across 0, which is "0", not "-0".
		{-1, 1, []string{"-1", "-0.5", "0", "0.5", "1"}},
		// No range: no ticks rather than a panic or an endless loop.
		{5, 5, nil},
		{0, math.Inf(1), nil},
	} {
		assert.Equal(t, tc.want, labels((plot.LinearTicks{}).Ticks(tc.lo, tc.hi)), "LinearTicks(%g, %g)", tc.lo, tc.hi)
	}
	// Minor ticks: every 100 between the labels of 0..2999.
	assert.Len(t, (plot.LinearTicks{}).Ticks(0, 2999), 30)
}

func TestLogTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []string
	}{
		// One decade (Fig. 1's TBT thresholds): 1, 2 and 5 times each
		// power of ten, not 100 and 1000 alone.
		{100, 1000, []string{"100", "200", "500", "1000"}},
		// Two decades, below 1: still 1-2-5, written short.
		{0.01, 1, []string{"0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"}},
		// Five decades (Fig. 9's capacities): powers of ten, with SI
		// suffixes.
		{1e4, 1e9, []string{"10k", "100k", "1M", "10M", "100M", "1G"}},
		// Less than a decade, not starting at a power of ten: labels
		// within the range only.
		{150, 900, []string{"200", "500"}},
		// Too short for two of those: every tick labelled.
		{300, 450, []string{"300", "400"}},
		// Not a positive range: no ticks rather than a panic.
		{0, 10, nil},
	} {
		assert.Equal(t, tc.want, labels((plot.LogTicks{}).Ticks(tc.lo, tc.hi)), "LogTicks(%g, %g)", tc.lo, tc.hi)
	}
	// Minor ticks at the other multiples: 300, 400, 600, 700, 800, 900.
	assert.Len(t, (plot.LogTicks{}).Ticks(100, 1000), 10)
}

func TestNumber(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 0.5: "0.5", 1000: "1000", 9999: "9999", 1e4: "10k", 31623: "31.62k",
		3e6: "3M", 1e9: "1G", -2e4: "-20k", 2.5e12: "2.5T",
	} {
		assert.Equal(t, want, plot.Number(v), "Number(%g)", v)
	}
}

// svgText is a <text> of an SVG: where it starts and what it says.
type svgText struct {
	X, Y float64
	S    string
}

// readSVG checks that path is a well-formed SVG document and returns its
// texts.
func readSVG(t *testing.T, path string) []svgText {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	d := xml.NewDecoder(f)
	var texts []svgText
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "well-formed XML")
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = el.Name.Local
		}
		if el.Name.Local != "text" {
			continue
		}
		var txt struct {
			X string `xml:"x,attr"`
			Y string `xml:"y,attr"`
			S string `xml:",chardata"`
		}
		require.NoError(t, d.DecodeElement(&txt, &el))
		x, err := strconv.ParseFloat(txt.X, 64)
		require.NoError(t, err)
		y, err := strconv.ParseFloat(txt.Y, 64)
		require.NoError(t, err)
		texts = append(texts, svgText{x, y, txt.S})
	}
	require.Equal(t, "svg", root)
	return texts
}

// find is the text that says s, failing the test if there is none.
func find(t *testing.T, texts []svgText, s string) svgText {
	t.Helper()
	for _, tx := range texts {
		if tx.S == s {
			return tx
		}
	}
	require.Failf(t, "text not in the SVG", "%q", s)
	return svgText{}
}

// readPNG checks that path is a PNG and returns its size.
func readPNG(t *testing.T, path string) image.Rectangle {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img.Bounds()
}

func TestSave(t *testing.T) {
	// Upper panel: latencies from 1 to 1000 ms, a percentage, a legend.
	p := plot.New("latency", "latency (ms)", "requests (CDF)")
	plot.Percent(&p.Y)
	var pts plot.XYs
	for i := 0; i <= 30; i++ {
		pts = append(pts, plot.XY{X: math.Pow(10, float64(i)/10), Y: float64(i) / 30})
	}
	l := plot.Line(pts, plot.Blue)
	p.Add(l)
	p.Legend.Add("a rather long series name", l)
	p.Legend.Add("bound", plot.HLine(p, 0.9, plot.Orange))
	// Lower panel: bars with their values.
	q := plot.New("bars", "policy", "mean TTFT (s)")
	require.NoError(t, plot.Bars(q, []string{"x", "y", "z"}, [][]float64{{1, 2, 3}, {4, math.NaN(), 6}},
		[]string{"first", "second"}, plot.Number))

	path := filepath.Join(t.TempDir(), "fig.png")
	require.NoError(t, plot.Save(path, p, q))

	// The PNG has the figure's size; the SVG is beside it.
	assert.Equal(t, image.Rect(0, 0, plot.Width, plot.TallHeight), readPNG(t, path))
	assert.Equal(t, filepath.Join(filepath.Dir(path), "fig.svg"), plot.SVGPath(path))
	texts := readSVG(t, plot.SVGPath(path))

	// Titles and axis titles, with their units.
	for _, s := range []string{"latency", "latency (ms)", "requests (CDF)", "bars", "policy", "mean TTFT (s)",
		"x", "y", "z", "4", "6", "first", "second"} {
		find(t, texts, s)
	}

	// Three decades of data: the X axis is logarithmic, its decades
	// evenly spaced; the percentage stays linear, from 0.
	assert.True(t, plot.IsLog(&p.X))
	assert.False(t, plot.IsLog(&p.Y))
	find(t, texts, "0%")
	x1, x10, x100, x1000 := find(t, texts, "1").X, find(t, texts, "10").X, find(t, texts, "100").X, find(t, texts, "1000").X
	decade := x10 - x1
	assert.Greater(t, decade, 100.0, "a decade is a third of the axis")
	// Label widths differ by a digit, about 6 points.
	assert.InDelta(t, decade, x100-x10, 8)
	assert.InDelta(t, decade, x1000-x100, 8)

	// The panels keep their legends: saved again, the figure is the same.
	again := filepath.Join(t.TempDir(), "again.png")
	require.NoError(t, plot.Save(again, p, q))
	assert.Equal(t, texts, readSVG(t, plot.SVGPath(again)))

	// The legends are right of the data: right of the X axis's last
	// label, level with their panels.
	for _, s := range []string{"a rather long series name", "bound", "first", "second"} {
		assert.Greater(t, find(t, texts, s).X, x1000+10, "legend entry %q", s)
	}
	// (SVG y grows downwards.)
	assert.Less(t, find(t, texts, "bound").Y, find(t, texts, "latency (ms)").Y, "upper legend in the upper panel")
	assert.Greater(t, find(t, texts, "first").Y, find(t, texts, "latency (ms)").Y, "lower legend in the lower panel")
}

func TestAutoLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		ys   []float64
		log  bool
	}{
		// Two decades: logarithmic.
		{"decades", []float64{0.5, 50}, true},
		// Less than two: linear.
		{"narrow", []float64{1, 90}, false},
		// A zero cannot go on a log axis.
		{"zero", []float64{0, 1000}, false},
		// Nor can a negative value.
		{"negative", []float64{-1, 1000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := plot.New("", "x", "y (ms)")
			var pts plot.XYs
			for i, y := range tc.ys {
				pts = append(pts, plot.XY{X: float64(i), Y: y})
			}
			p.Add(plot.Dots(pts, plot.LightGray))
			require.NoError(t, plot.Save(filepath.Join(t.TempDir(), "f.png"), p))
			assert.Equal(t, tc.log, plot.IsLog(&p.Y))
			assert.False(t, plot.IsLog(&p.X), "0 and 1")
		})
	}
}

func TestSaveOnePanel(t *testing.T) {
	// A panel without data or legend still draws its axes, at the short
	// height.
	path := filepath.Join(t.TempDir(), "empty.png")
	require.NoError(t, plot.Save(path, plot.New("nothing yet", "time (s)", "rate (GB/s)")))
	assert.Equal(t, image.Rect(0, 0, plot.Width, plot.ShortHeight), readPNG(t, path))
	texts := readSVG(t, plot.SVGPath(path))
	find(t, texts, "time (s)")
	find(t, texts, "rate (GB/s)")

	// Nothing to draw, or nowhere to write, is an error.
	require.Error(t, plot.Save(path))
	require.Error(t, plot.Save(filepath.Join(t.TempDir(), "no", "such.png"), plot.New("", "", "")))
}

// A log axis is as long as a linear one: the axis titles take the same
// room whatever the scale (gonum's own layout shrinks a log panel).
func TestLogAxisLength(t *testing.T) {
	span := func(ys plot.XYs, lo, hi string) float64 {
		p := plot.New("latency", "request", "latency (ms)")
		p.Add(plot.Dots(ys, plot.Blue))
		path := filepath.Join(t.TempDir(), "f.png")
		require.NoError(t, plot.Save(path, p))
		texts := readSVG(t, plot.SVGPath(path))
		return find(t, texts, lo).Y - find(t, texts, hi).Y
	}
	// (X from 3, so that no X label reads as a Y one.)
	linear := span(plot.XYs{{X: 3, Y: 0}, {X: 4, Y: 100}}, "0", "100")
	log := span(plot.XYs{{X: 3, Y: 0.01}, {X: 4, Y: 100}}, "0.01", "100")
	assert.Greater(t, linear, 150.0, "most of the figure's height")
	assert.InDelta(t, linear, log, 1)
}

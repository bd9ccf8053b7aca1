package plot

import (
	"bufio"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/mooncake-go/mooncake/internal/fileout"
)

// Panel is one chart of a figure: gonum's Plot, with its axes, plotters
// and legend entries.
type Panel = gplot.Plot

// XYs are the points of a line or a scatter, in data coordinates.
type XYs = plotter.XYs

// XY is one point of XYs.
type XY = plotter.XY

// Colours of the charts: a palette for series (matplotlib's first
// colours, so the plots read like the paper's) and a grey for clouds of
// points and marks.
var (
	LightGray = color.RGBA{170, 170, 170, 255}
	Blue      = color.RGBA{31, 119, 180, 255}
	Orange    = color.RGBA{255, 127, 14, 255}
	Green     = color.RGBA{44, 160, 44, 255}
	Red       = color.RGBA{214, 39, 40, 255}
	Purple    = color.RGBA{148, 103, 189, 255}
	Brown     = color.RGBA{140, 86, 75, 255}
)

// Palette is the series colours in the order charts use them.
var Palette = []color.RGBA{Blue, Orange, Green, Red, Purple, Brown}

// Colour is series i's colour, the palette repeating.
func Colour(i int) color.RGBA { return Palette[i%len(Palette)] }

// The size of the repository's figures in pixels: Width wide, and
// ShortHeight high with one panel, TallHeight with two (each further
// panel adds PanelHeight). The PNGs are drawn at DPI dots per inch, which
// sets the size of the text against these.
const (
	Width       = 1000
	ShortHeight = 420
	TallHeight  = ShortHeight + PanelHeight
	PanelHeight = 300
	DPI         = 96
)

// Decades is how many powers of ten the positive data of an axis must
// span for Save to make the axis logarithmic.
const Decades = 2

// px is n pixels of a figure as a length.
func px(n float64) vg.Length { return vg.Length(n) * vg.Inch / DPI }

// New returns an empty panel with a title, and axis titles that should
// name the quantity and its unit ("TBT threshold (ms)"), with a grid at
// the labelled ticks.
func New(title, x, y string) *Panel {
	p := gplot.New()
	p.Title.Text = title
	p.Title.Padding = px(6)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font,
		&p.X.Tick.Label.Font, &p.Y.Tick.Label.Font, &p.Legend.TextStyle.Font} {
		sans(f)
	}
	p.X.Tick.Marker, p.Y.Tick.Marker = LinearTicks{}, LinearTicks{}
	p.Add(grid{})
	return p
}

// grid draws light lines at the labelled ticks, but none across a
// category axis (Bars), whose ticks are at the bars' centres.
type grid struct{}

func (grid) Plot(c draw.Canvas, p *gplot.Plot) {
	g := plotter.NewGrid()
	g.Vertical.Color, g.Horizontal.Color = color.Gray{Y: 225}, color.Gray{Y: 225}
	if _, nominal := p.X.Tick.Marker.(gplot.ConstantTicks); nominal {
		g.Vertical.Color = nil
	}
	g.Plot(c, p)
}

// sans sets f's face to Liberation Sans, which reads better on screen
// than gonum's default serif, keeping its size.
func sans(f *font.Font) { f.Typeface, f.Variant = "Liberation", "Sans" }

// Line joins pts with a solid line of colour col.
func Line(pts XYs, col color.Color) *plotter.Line {
	return &plotter.Line{XYs: pts, LineStyle: draw.LineStyle{Color: col, Width: px(2)}}
}

// Dashed joins pts with a dashed line of colour col.
func Dashed(pts XYs, col color.Color) *plotter.Line {
	l := Line(pts, col)
	l.Dashes = []vg.Length{px(6), px(4)}
	return l
}

// Dots marks every point of pts with a dot of colour col, small enough
// for clouds of thousands.
func Dots(pts XYs, col color.Color) *plotter.Scatter {
	return &plotter.Scatter{XYs: pts, GlyphStyle: draw.GlyphStyle{
		Color: col, Radius: px(1.5), Shape: draw.CircleGlyph{}}}
}

// HLine adds to p a dashed horizontal line across the panel at y, which
// the Y axis is stretched to show, and returns it for the legend.
func HLine(p *Panel, y float64, col color.Color) *plotter.Function {
	f := plotter.NewFunction(func(float64) float64 { return y })
	f.Samples = 2
	f.LineStyle = draw.LineStyle{Color: col, Width: px(2), Dashes: []vg.Length{px(6), px(4)}}
	p.Y.Min, p.Y.Max = min(p.Y.Min, y), max(p.Y.Max, y)
	p.Add(f)
	return f
}

// VLine adds to p a dashed vertical line at x from the bottom of the Y
// axis to its top as they are now (add it after the data), and returns it
// for the legend.
func VLine(p *Panel, x float64, col color.Color) *plotter.Line {
	l := Dashed(XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}}, col)
	p.Add(l)
	return l
}

// Bars adds to p one group of bars per category, one bar per series in
// each: series[s][i] is series s's value in category i, drawn in
// Colour(s) and named names[s] in the legend (no legend if names is nil),
// with its value written above by label (none if label is nil). NaN
// values are left out.
func Bars(p *Panel, categories []string, series [][]float64, names []string, label func(float64) string) error {
	if len(series) == 0 {
		return nil
	}
	p.NominalX(categories...)
	// Group i is centred at i: each has a slot one wide, and fills 60%
	// of it (the data area being about 85% of the figure's width).
	w := px(0.85 * Width * 0.6 / float64(max(len(categories), 1)) / float64(len(series)))
	top := 0.0
	for s, vals := range series {
		vs := make(plotter.Values, len(vals))
		var at XYs
		var texts []string
		for i, v := range vals {
			if math.IsNaN(v) {
				continue
			}
			vs[i], top = v, max(top, v)
			at = append(at, plotter.XY{X: float64(i), Y: v})
			if label != nil {
				texts = append(texts, label(v))
			}
		}
		b, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return fmt.Errorf("plot: bars of series %d: %w", s, err)
		}
		b.Color, b.LineStyle.Width = Colour(s), 0
		b.Offset = w * (vg.Length(s) - vg.Length(len(series)-1)/2)
		p.Add(b)
		if names != nil {
			p.Legend.Add(names[s], b)
		}
		if label != nil && len(at) > 0 {
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: at, Labels: texts})
			if err != nil {
				return fmt.Errorf("plot: labels of series %d: %w", s, err)
			}
			for i := range l.TextStyle {
				l.TextStyle[i].XAlign = draw.XCenter
				sans(&l.TextStyle[i].Font)
			}
			l.Offset = vg.Point{X: b.Offset, Y: px(4)}
			p.Add(l)
		}
	}
	// From 0, with room above the tallest bar for its label.
	p.X.Min, p.X.Max = -0.5, float64(len(categories))-0.5
	p.Y.Min, p.Y.Max = 0, max(p.Y.Max, 1.15*top)
	return nil
}

// Percent labels the ticks of a as percentages of ratios, and starts it
// at 0.
func Percent(a *gplot.Axis) {
	a.Min = 0
	a.Tick.Marker = percentTicks{}
}

// percentTicks are LinearTicks labelled as percentages.
type percentTicks struct{}

func (percentTicks) Ticks(lo, hi float64) []gplot.Tick {
	ts := LinearTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(math.Round(ts[i].Value*1e5)/1e3, 'f', -1, 64) + "%"
		}
	}
	return ts
}

// LinearTicks mark a linear axis at round values, 1, 2 or 5 times a power
// of ten apart, about six of them labelled, with minor ticks between.
// gonum's DefaultTicks aims at three labels and writes them with the
// decimals of its step's mantissa (2500.00 for a step of 2500).
type LinearTicks struct{}

// Ticks returns the ticks from lo to hi.
func (LinearTicks) Ticks(lo, hi float64) []gplot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return nil
	}
	// The round step nearest (hi-lo)/6, on a log scale.
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	var step, minors float64
	for _, m := range []struct{ step, minors float64 }{{1, 5}, {2, 2}, {5, 5}, {10, 5}} {
		if step == 0 || math.Abs(math.Log(m.step*mag/raw)) < math.Abs(math.Log(step/raw)) {
			step, minors = m.step*mag, m.minors
		}
	}
	minor := step / minors
	var ts []gplot.Tick
	// Counted in minor steps, so that labelled ones are exact multiples.
	for i := math.Ceil(lo/minor - 1e-9); i*minor <= hi+1e-9*(hi-lo); i++ {
		t := gplot.Tick{Value: i*minor + 0} // + 0: -0 is 0
		if math.Mod(i, minors) == 0 {
			t.Label = Number(t.Value)
		}
		ts = append(ts, t)
	}
	return ts
}

// Log makes a logarithmic, marked by LogTicks: its data must be
// positive.
func Log(a *gplot.Axis) {
	a.Scale = gplot.LogScale{}
	a.Tick.Marker = LogTicks{}
}

// IsLog reports whether a is logarithmic.
func IsLog(a *gplot.Axis) bool {
	_, ok := a.Scale.(gplot.LogScale)
	return ok
}

// spansDecades reports whether a's data range, as gonum keeps it while
// plotters are added, is positive and spans Decades powers of ten.
func spansDecades(a *gplot.Axis) bool {
	return a.Min > 0 && !math.IsInf(a.Max, 0) && math.Log10(a.Max/a.Min) >= Decades
}

// autoLog makes each linear, numeric axis of p logarithmic where its data
// spans decades. An axis that should stay linear starts at 0 (set its Min
// to 0, as Percent and Bars do).
func autoLog(p *Panel) {
	for _, a := range []*gplot.Axis{&p.X, &p.Y} {
		if _, linear := a.Scale.(gplot.LinearScale); !linear {
			continue
		}
		if _, nominal := a.Tick.Marker.(gplot.ConstantTicks); nominal {
			continue
		}
		if spansDecades(a) {
			Log(a)
		}
	}
}

// LogTicks marks a logarithmic axis so that it reads at a glance: over a
// decade or two, labels at 1, 2 and 5 times each power of ten (an axis
// from 100 to 1000 gets 100, 200, 500 and 1000, not 100 and 1000 alone as
// gonum's LogTicks gives); over more, a label at each power of ten; minor
// ticks at the other multiples.
type LogTicks struct{}

// Ticks returns the ticks from lo to hi (both positive).
func (LogTicks) Ticks(lo, hi float64) []gplot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	labelled := map[int]bool{1: true}
	if math.Log10(hi/lo) <= 2.1 {
		labelled[2], labelled[5] = true, true
	}
	var ts []gplot.Tick
	labels := 0
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for m := 1; m <= 9; m++ {
			// Via the exponent, so that 10^-1 is 0.1, not 0.10000000000000002.
			v := float64(m) * math.Pow(10, e)
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := gplot.Tick{Value: v}
			if labelled[m] {
				t.Label = Number(v)
				labels++
			}
			ts = append(ts, t)
		}
	}
	// A range too short for two of those (300 to 450) labels them all.
	if labels < 2 {
		for i := range ts {
			ts[i].Label = Number(ts[i].Value)
		}
	}
	return ts
}

// Number writes v short: as is below 10,000, with an SI suffix (k, M, G,
// T) from there.
func Number(v float64) string {
	short := func(f float64, suffix string) string { return strconv.FormatFloat(v/f, 'g', 4, 64) + suffix }
	switch a := math.Abs(v); {
	case a >= 1e12:
		return short(1e12, "T")
	case a >= 1e9:
		return short(1e9, "G")
	case a >= 1e6:
		return short(1e6, "M")
	case a >= 1e4:
		return short(1e3, "k")
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// Save draws panels one above the other as a PNG at path and as an SVG
// beside it (the same name, with the extension .svg). The panels share
// their data areas' left and right edges; each panel's legend goes in a
// column on the right, level with its data area, so that it never hides
// data. An axis whose data spans Decades powers of ten is made
// logarithmic first (see Log).
func Save(path string, panels ...*Panel) error {
	if len(panels) == 0 {
		return fmt.Errorf("plot: no panels for %s", path)
	}
	legends := make([]gplot.Legend, len(panels))
	for i, p := range panels {
		autoLog(p)
		// Taken from the panel while it is drawn, so that gonum does not
		// draw it over the data.
		legends[i], p.Legend = p.Legend, gplot.NewLegend()
		defer func() { p.Legend = legends[i] }()
	}
	w, h := px(Width), px(ShortHeight+PanelHeight*float64(len(panels)-1))

	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(DPI))
	drawFigure(draw.New(img), panels, legends)
	if err := fileout.Write(path, func(w *bufio.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
		return err
	}); err != nil {
		return fmt.Errorf("plot: %w", err)
	}

	svg := vgsvg.New(w, h)
	drawFigure(draw.New(svg), panels, legends)
	if err := fileout.Write(SVGPath(path), func(w *bufio.Writer) error {
		_, err := svg.WriteTo(w)
		return err
	}); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// SVGPath is where Save writes the SVG of the PNG at path.
func SVGPath(path string) string { return strings.TrimSuffix(path, filepath.Ext(path)) + ".svg" }

// drawFigure lays out and draws panels and their legends on dc.
//
// It draws the axis titles itself: gonum reserves room for a title
// centred on the arithmetic middle of the axis's range, which on a log
// axis lies near its end, so the title's box juts out and gonum shrinks
// the panel to fit it (by a fifth of the height for latencies over four
// decades).
func drawFigure(dc draw.Canvas, panels []*Panel, legends []gplot.Legend) {
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	pad := px(12)
	var legendW vg.Length
	for i := range legends {
		legendW = max(legendW, legends[i].Rectangle(dc).Size().X)
	}
	area := dc
	if legendW > 0 {
		area = draw.Crop(dc, 0, -(legendW + 2*pad), 0, 0)
	}
	titles := make([][2]gplot.Axis, len(panels))
	var left, bottom vg.Length
	for i, p := range panels {
		titles[i] = [2]gplot.Axis{p.X, p.Y}
		left = max(left, titleRoom(p.Y))
		bottom = max(bottom, titleRoom(p.X))
		p.X.Label.Text, p.Y.Label.Text = "", ""
	}
	defer func() {
		for i, p := range panels {
			p.X.Label.Text, p.Y.Label.Text = titles[i][0].Label.Text, titles[i][1].Label.Text
		}
	}()
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: pad, PadBottom: pad / 2, PadLeft: pad / 2,
		PadRight: pad, PadY: 2 * pad}
	rows := make([][]*gplot.Plot, len(panels))
	for i, p := range panels {
		rows[i] = []*gplot.Plot{p}
	}
	cs := gplot.Align(rows, tiles, draw.Crop(area, left, 0, 0, 0))
	for i, p := range panels {
		tile := draw.Crop(cs[i][0], 0, 0, bottom, 0)
		p.Draw(tile)
		data := p.DataCanvas(tile)
		x, y := titles[i][0].Label, titles[i][1].Label
		if x.Text != "" {
			d := x.TextStyle.FontExtents().Descent
			dc.FillText(x.TextStyle, vg.Point{X: data.Center().X, Y: cs[i][0].Min.Y + d}, x.Text)
		}
		if y.Text != "" {
			sty := y.TextStyle
			sty.Rotation += math.Pi / 2
			d := y.TextStyle.FontExtents().Descent
			dc.FillText(sty, vg.Point{X: cs[i][0].Min.X - left + y.TextStyle.Height(y.Text) - d, Y: data.Center().Y},
				y.Text)
		}
		col := data
		col.Min.X, col.Max.X = area.Max.X+pad, dc.Max.X-pad
		l := legends[i]
		l.Top, l.Left = true, true
		l.Draw(col)
	}
}

// titleRoom is the room a's title takes beside the axis.
func titleRoom(a gplot.Axis) vg.Length {
	if a.Label.Text == "" {
		return 0
	}
	return a.Label.TextStyle.Height(a.Label.Text) + px(6)
}

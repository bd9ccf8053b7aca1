package plot

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/mooncake-go/mooncake/internal/fileout"
)

// Colours of the charts: a white background, black ink, a light grid and a
// palette for series (matplotlib's first colours, so the plots read like
// the paper's).
var (
	White     = color.RGBA{255, 255, 255, 255}
	Black     = color.RGBA{0, 0, 0, 255}
	Grid      = color.RGBA{225, 225, 225, 255}
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

// Canvas is an image that charts draw lines, dots, bars and text on.
type Canvas struct {
	// Img is the picture drawn so far.
	Img *image.RGBA
}

// NewCanvas returns a white canvas of w x h pixels.
func NewCanvas(w, h int) *Canvas {
	c := &Canvas{image.NewRGBA(image.Rect(0, 0, w, h))}
	draw.Draw(c.Img, c.Img.Bounds(), image.NewUniform(White), image.Point{}, draw.Src)
	return c
}

// Encode writes the canvas as a PNG.
func (c *Canvas) Encode(w io.Writer) error { return png.Encode(w, c.Img) }

// Save writes the canvas as a PNG file at path.
func (c *Canvas) Save(path string) error {
	return fileout.Write(path, func(w *bufio.Writer) error { return c.Encode(w) })
}

// Set paints one pixel; points outside the canvas are ignored.
func (c *Canvas) Set(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.Img.Rect) {
		c.Img.SetRGBA(x, y, col)
	}
}

// Line draws a segment two pixels wide (Bresenham).
func (c *Canvas) Line(x0, y0, x1, y1 int, col color.RGBA) {
	c.line(x0, y0, x1, y1, col, 0)
}

// DashedLine draws a segment like Line, in dashes of 6 pixels.
func (c *Canvas) DashedLine(x0, y0, x1, y1 int, col color.RGBA) {
	c.line(x0, y0, x1, y1, col, 6)
}

func (c *Canvas) line(x0, y0, x1, y1 int, col color.RGBA, dash int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for n := 0; ; n++ {
		if dash == 0 || (n/dash)%2 == 0 {
			c.Set(x0, y0, col)
			c.Set(x0+1, y0, col)
			c.Set(x0, y0+1, col)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

// Dot paints a 2x2 square at x, y.
func (c *Canvas) Dot(x, y int, col color.RGBA) {
	for _, d := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}} {
		c.Set(x+d[0], y+d[1], col)
	}
}

// Fill paints the rectangle from x0, y0 to x1, y1, both included.
func (c *Canvas) Fill(x0, y0, x1, y1 int, col color.RGBA) {
	for y := min(y0, y1); y <= max(y0, y1); y++ {
		for x := min(x0, x1); x <= max(x0, x1); x++ {
			c.Set(x, y, col)
		}
	}
}

// Text writes s with its baseline at y; a glyph is 7 pixels wide.
func (c *Canvas) Text(x, y int, s string, col color.RGBA) {
	d := font.Drawer{Dst: c.Img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// TextWidth is the width of s in pixels.
func TextWidth(s string) int { return 7 * len(s) }

// Legend lists names one under the other from x, y, each after a short
// line of its colour.
func (c *Canvas) Legend(x, y int, names []string, cols []color.RGBA) {
	for i, name := range names {
		yy := y + 16*i
		c.Line(x, yy-4, x+20, yy-4, cols[i])
		c.Text(x+26, yy, name, Black)
	}
}

// The layout of the repository's figures, in pixels: Width wide, either
// two panels one above the other (Upper, Lower) on a canvas TallHeight
// high, or one (Single) on a canvas ShortHeight high. Each panel leaves
// room on its left for the Y labels, above for its title and below for
// the X labels.
const (
	Width       = 1000
	TallHeight  = 720
	ShortHeight = 420
	marginL     = 70
	marginR     = 20
)

// Upper is the upper panel of a TallHeight figure, its data bounds to
// fill in.
func Upper() Panel { return Panel{X0: marginL, Y0: 40, X1: Width - marginR, Y1: 310} }

// Lower is the lower panel of a TallHeight figure.
func Lower() Panel { return Panel{X0: marginL, Y0: 400, X1: Width - marginR, Y1: 670} }

// Single is the panel of a ShortHeight figure.
func Single() Panel { return Panel{X0: marginL, Y0: 40, X1: Width - marginR, Y1: 370} }

// Panel maps data coordinates to the pixel box X0..X1, Y0..Y1 (Y grows
// downwards on the canvas, upwards in data).
type Panel struct {
	X0, Y0, X1, Y1 int
	// XMin and XMax bound the X axis; XMin is taken as 0 unless LogX.
	XMin, XMax float64
	// YMax bounds the Y axis, which starts at 0.
	YMax float64
	// LogX makes the X axis logarithmic from XMin (> 0) to XMax, with a
	// grid line and label at every power of ten.
	LogX bool
	// Categories, when set, makes the X axis categorical: one slot per
	// name, labelled under the axis; Bars fills the slots.
	Categories []string
}

// PX is the pixel column of x.
func (p Panel) PX(x float64) int {
	if p.LogX {
		f := (math.Log10(x) - math.Log10(p.XMin)) / (math.Log10(p.XMax) - math.Log10(p.XMin))
		return p.X0 + int(math.Round(f*float64(p.X1-p.X0)))
	}
	return p.X0 + int(math.Round(x/p.XMax*float64(p.X1-p.X0)))
}

// PY is the pixel row of y.
func (p Panel) PY(y float64) int { return p.Y1 - int(math.Round(y/p.YMax*float64(p.Y1-p.Y0))) }

// Axes draws the frame, a grid at round values with their labels (ylabel
// formats the Y ones), and the title above.
func (p Panel) Axes(c *Canvas, title string, ylabel func(float64) string) {
	for _, v := range Ticks(p.YMax, 5) {
		y := p.PY(v)
		for x := p.X0; x <= p.X1; x++ {
			c.Set(x, y, Grid)
		}
		s := ylabel(v)
		c.Text(p.X0-8-TextWidth(s), y+4, s, Black)
	}
	switch {
	case len(p.Categories) > 0:
		for i, name := range p.Categories {
			x := p.slot(i)
			c.Text(x-TextWidth(name)/2, p.Y1+16, name, Black)
		}
	case p.LogX:
		for e := math.Ceil(math.Log10(p.XMin) - 1e-9); e <= math.Log10(p.XMax)+1e-9; e++ {
			x := p.PX(math.Pow(10, e))
			for y := p.Y0; y <= p.Y1; y++ {
				c.Set(x, y, Grid)
			}
			s := fmt.Sprintf("1e%d", int(e))
			c.Text(x-TextWidth(s)/2, p.Y1+16, s, Black)
		}
	default:
		for _, v := range Ticks(p.XMax, 8) {
			x := p.PX(v)
			for y := p.Y0; y <= p.Y1; y++ {
				c.Set(x, y, Grid)
			}
			s := strconv.FormatFloat(v, 'f', -1, 64)
			c.Text(x-TextWidth(s)/2, p.Y1+16, s, Black)
		}
	}
	for x := p.X0; x <= p.X1; x++ {
		c.Set(x, p.Y0, Black)
		c.Set(x, p.Y1, Black)
	}
	for y := p.Y0; y <= p.Y1; y++ {
		c.Set(p.X0, y, Black)
		c.Set(p.X1, y, Black)
	}
	c.Text(p.X0, p.Y0-8, title, Black)
}

// Polyline joins pts (data coordinates) with lines.
func (p Panel) Polyline(c *Canvas, pts [][2]float64, col color.RGBA) {
	for i := 1; i < len(pts); i++ {
		c.Line(p.PX(pts[i-1][0]), p.PY(pts[i-1][1]), p.PX(pts[i][0]), p.PY(pts[i][1]), col)
	}
}

// HLine draws a dashed horizontal line across the panel at y.
func (p Panel) HLine(c *Canvas, y float64, col color.RGBA) {
	c.DashedLine(p.X0, p.PY(y), p.X1, p.PY(y), col)
}

// slot is the pixel column of the centre of category i.
func (p Panel) slot(i int) int {
	w := float64(p.X1-p.X0) / float64(len(p.Categories))
	return p.X0 + int(math.Round(w*(float64(i)+0.5)))
}

// Bars draws, in every category slot, one bar per series side by side:
// series[s][i] is series s's value in category i, drawn in Palette[s],
// with its value (formatted by label, unless nil) above the bar.
func (p Panel) Bars(c *Canvas, series [][]float64, label func(float64) string) {
	if len(p.Categories) == 0 || len(series) == 0 {
		return
	}
	slotW := float64(p.X1-p.X0) / float64(len(p.Categories))
	barW := int(slotW * 0.7 / float64(len(series)))
	for s, vals := range series {
		col := Palette[s%len(Palette)]
		for i, v := range vals {
			if i >= len(p.Categories) || math.IsNaN(v) {
				continue
			}
			left := p.slot(i) - barW*len(series)/2 + s*barW
			top := p.PY(min(v, p.YMax))
			c.Fill(left+1, top, left+barW-1, p.Y1-1, col)
			if label != nil {
				t := label(v)
				c.Text(left+barW/2-TextWidth(t)/2, top-4, t, Black)
			}
		}
	}
}

// Percent labels a ratio as a percentage.
func Percent(v float64) string { return fmt.Sprintf("%g%%", math.Round(v*1000)/10) }

// Plain labels a value as is.
func Plain(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// Step is a round distance (1, 2 or 5 times a power of ten) that cuts
// 0..hi into about n.
func Step(hi float64, n int) float64 {
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// Ticks are about n round values from 0 to hi.
func Ticks(hi float64, n int) []float64 {
	s := Step(hi, n)
	var out []float64
	for i := 0.0; i*s <= hi*(1+1e-9); i++ {
		// Rounded, so that 3*0.1 prints as 0.3.
		out = append(out, math.Round(i*s*1e9)/1e9)
	}
	return out
}

// NiceCeil rounds v up to a multiple of its step, so the top of the axis
// is a labelled round value.
func NiceCeil(v float64) float64 {
	s := Step(v, 5)
	return math.Ceil(v/s-1e-9) * s
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

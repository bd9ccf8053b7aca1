package trace

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Plot geometry, in pixels.
const (
	plotW, plotH = 1000, 720
	marginL      = 70
	marginR      = 20
	panelH       = 270
	topY         = 40  // top of the hit-ratio panel
	bottomY      = 400 // top of the latency panel
)

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{0, 0, 0, 255}
	grid      = color.RGBA{225, 225, 225, 255}
	blue      = color.RGBA{31, 119, 180, 255}
	orange    = color.RGBA{255, 127, 14, 255}
	lightGray = color.RGBA{170, 170, 170, 255}
)

// WritePlot draws rs as a PNG at path: above, the cumulative hit ratio
// against the request index, actual and infinite-cache bound; below, the
// latency of every BatchGet (grey dots, clipped at the 99.5th percentile)
// and its median over windows of requests.
func WritePlot(path string, rs []RequestResult) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	bw := bufio.NewWriter(f)
	if err := encodePlot(bw, rs); err != nil {
		return err
	}
	return bw.Flush()
}

func encodePlot(w io.Writer, rs []RequestResult) error {
	c := &canvas{image.NewRGBA(image.Rect(0, 0, plotW, plotH))}
	draw.Draw(c.img, c.img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)
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
	p := panel{x0: marginL, y0: topY, x1: plotW - marginR, y1: topY + panelH,
		xmax: n, ymax: niceCeil(max(top*1.1, 0.01))}
	p.axes(c, "cumulative hit ratio (blocks hit / blocks asked)", func(v float64) string {
		return fmt.Sprintf("%g%%", math.Round(v*1000)/10)
	})
	p.polyline(c, infinite, orange)
	p.polyline(c, actual, blue)
	c.legend(p.x0+10, p.y0+16, []string{"actual", "infinite-cache bound"}, []color.RGBA{blue, orange})

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
		ceil = niceCeil(max(sorted[int(0.995*float64(len(sorted)-1))]*1.1, 1e-3))
	}
	q := panel{x0: marginL, y0: bottomY, x1: plotW - marginR, y1: bottomY + panelH, xmax: n, ymax: ceil}
	q.axes(c, "BatchGet latency (ms) by request", func(v float64) string { return fmt.Sprintf("%g", v) })
	for _, pt := range lat {
		x, y := q.px(pt[0]), q.py(min(pt[1], ceil))
		c.dot(x, y, lightGray)
	}
	// Median over windows of about 4 pixels.
	window := max(int(n)*4/(q.x1-q.x0), 1)
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
	q.polyline(c, med, blue)
	c.legend(q.x0+10, q.y0+16, []string{"each get", fmt.Sprintf("median per %d requests", window)},
		[]color.RGBA{lightGray, blue})
	c.text(plotW/2-60, plotH-12, "request index (trace order)", black)
	return png.Encode(w, c.img)
}

// canvas draws lines, dots and text on an image.
type canvas struct{ img *image.RGBA }

func (c *canvas) set(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.img.Rect) {
		c.img.SetRGBA(x, y, col)
	}
}

// line draws a segment two pixels wide (Bresenham).
func (c *canvas) line(x0, y0, x1, y1 int, col color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		c.set(x0, y0, col)
		c.set(x0+1, y0, col)
		c.set(x0, y0+1, col)
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

func (c *canvas) dot(x, y int, col color.RGBA) {
	for _, d := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}} {
		c.set(x+d[0], y+d[1], col)
	}
}

// text writes s with its baseline at y.
func (c *canvas) text(x, y int, s string, col color.RGBA) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func (c *canvas) legend(x, y int, names []string, cols []color.RGBA) {
	for i, name := range names {
		yy := y + 16*i
		c.line(x, yy-4, x+20, yy-4, cols[i])
		c.text(x+26, yy, name, black)
	}
}

// panel maps data (0..xmax, 0..ymax) to the pixel box x0..x1, y0..y1.
type panel struct {
	x0, y0, x1, y1 int
	xmax, ymax     float64
}

func (p panel) px(x float64) int { return p.x0 + int(math.Round(x/p.xmax*float64(p.x1-p.x0))) }
func (p panel) py(y float64) int { return p.y1 - int(math.Round(y/p.ymax*float64(p.y1-p.y0))) }

// axes draws the frame, a grid at round values with their labels, and the
// title above.
func (p panel) axes(c *canvas, title string, ylabel func(float64) string) {
	for _, v := range ticks(p.ymax, 5) {
		y := p.py(v)
		for x := p.x0; x <= p.x1; x++ {
			c.set(x, y, grid)
		}
		s := ylabel(v)
		c.text(p.x0-8-7*len(s), y+4, s, black)
	}
	for _, v := range ticks(p.xmax, 8) {
		x := p.px(v)
		for y := p.y0; y <= p.y1; y++ {
			c.set(x, y, grid)
		}
		s := strconv.FormatFloat(v, 'f', -1, 64)
		c.text(x-7*len(s)/2, p.y1+16, s, black)
	}
	for x := p.x0; x <= p.x1; x++ {
		c.set(x, p.y0, black)
		c.set(x, p.y1, black)
	}
	for y := p.y0; y <= p.y1; y++ {
		c.set(p.x0, y, black)
		c.set(p.x1, y, black)
	}
	c.text(p.x0, p.y0-8, title, black)
}

func (p panel) polyline(c *canvas, pts [][2]float64, col color.RGBA) {
	for i := 1; i < len(pts); i++ {
		c.line(p.px(pts[i-1][0]), p.py(pts[i-1][1]), p.px(pts[i][0]), p.py(pts[i][1]), col)
	}
}

// step is a round distance (1, 2 or 5 times a power of ten) that cuts
// 0..hi into about n.
func step(hi float64, n int) float64 {
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// ticks are about n round values from 0 to hi.
func ticks(hi float64, n int) []float64 {
	s := step(hi, n)
	var out []float64
	for i := 0.0; i*s <= hi*(1+1e-9); i++ {
		// Rounded, so that 3*0.1 prints as 0.3.
		out = append(out, math.Round(i*s*1e9)/1e9)
	}
	return out
}

// niceCeil rounds v up to a multiple of its step, so the top of the axis
// is a labelled round value.
func niceCeil(v float64) float64 {
	s := step(v, 5)
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

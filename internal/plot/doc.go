// Package plot draws the small PNG charts of the benchmarks and the
// simulator: line plots, dots and bars on a white canvas, with a grid at
// round values, labels in a fixed 7x13 font and a legend. It needs nothing
// beyond golang.org/x/image, so every command of the repository can write
// its plots without a plotting stack.
//
// A chart is a Canvas and one or more Panels on it; a Panel maps data
// coordinates to a pixel box and draws its own axes:
//
//	c := plot.NewCanvas(800, 500)
//	p := plot.Panel{X0: 70, Y0: 40, X1: 780, Y1: 440, XMax: 10, YMax: 1}
//	p.Axes(c, "hit ratio", plot.Percent)
//	p.Polyline(c, [][2]float64{{0, 0}, {10, 0.5}}, plot.Blue)
//	c.Legend(p.X0+10, p.Y0+16, []string{"LRU"}, []color.RGBA{plot.Blue})
//	err := c.Save("hits.png")
//
// The repository's figures share one layout: Width wide, with the Upper
// and Lower panels of a TallHeight canvas or the Single one of a
// ShortHeight canvas.
//
// The X axis is linear from 0 by default; LogX makes it logarithmic from
// XMin, Categories puts one labelled slot per category for bar charts.
package plot

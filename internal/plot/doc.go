// Package plot draws the figures of the benchmarks and the simulator with
// gonum's plot package (gonum.org/v1/plot), in one house style: panels
// stacked on a page Width pixels wide, every axis titled with its
// quantity and unit, each panel's legend in a column to the right of its
// data, and every figure written twice, as a PNG and as an SVG beside it.
//
// A panel is gonum's Plot; New gives one with a title, axis titles and a
// grid, and the helpers add the repository's plotters to it:
//
//	p := plot.New("hit ratio vs capacity", "cache capacity (tokens)", "hit ratio")
//	plot.Log(&p.X)
//	plot.Percent(&p.Y)
//	l := plot.Line(pts, plot.Blue)
//	p.Add(l)
//	p.Legend.Add("LRU", l)
//	err := plot.Save("hits.png", p) // hits.png and hits.svg
//
// Save makes an axis logarithmic when its data is positive and spans
// Decades powers of ten; an axis that must stay linear starts at 0
// (Percent and Bars start theirs there).
//
// What is ours rather than gonum's, and why:
//   - LinearTicks: gonum's DefaultTicks aims at three labels and writes
//     them with its step's decimals ("2500.00");
//   - LogTicks: gonum's LogTicks labels powers of ten only, so an axis
//     over one decade (Fig. 1's 100 ms to 1 s) gets two labels; ours
//     labels 1, 2 and 5 times each power of ten over a decade or two;
//   - Percent: gonum has no percentage ticker;
//   - the legend column: gonum draws a legend inside the data area, over
//     the lines; Save takes each panel's legend out and draws it beside;
//   - the axis titles: gonum reserves room for a title at the arithmetic
//     middle of the axis's range, near the end of a log axis, and shrinks
//     the panel to fit it there; Save draws them itself, centred.
package plot

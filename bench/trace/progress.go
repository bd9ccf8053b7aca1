package trace

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// barEvery is how often the progress bar is redrawn on a terminal.
const barEvery = 250 * time.Millisecond

// progress shows the replay's state from its counters, on its own
// goroutine, which alone writes to w: on a terminal, a progressbar (bar,
// count, ETA) with the hit ratios, bytes and rate after it; elsewhere
// (a log, a pipe) a plain line every period, since a bar redrawn with
// carriage returns is unreadable there and progressbar has no such mode.
type progress struct {
	w      io.Writer
	bar    *progressbar.ProgressBar // nil: plain lines
	total  int
	c      *counters
	start  time.Time
	quit   chan struct{}
	exited chan struct{}
}

// startProgress starts reporting to w, or does nothing if w is nil.
func startProgress(w io.Writer, every time.Duration, total int, c *counters, start time.Time) *progress {
	p := &progress{w: w, total: total, c: c, start: start}
	if w == nil {
		return p
	}
	if f, ok := w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) && total > 0 {
		p.bar, every = newBar(w, total), barEvery
	}
	p.quit, p.exited = make(chan struct{}), make(chan struct{})
	go p.loop(every)
	return p
}

// newBar is a bar of total requests as wide as the terminal, with the
// count, the time spent and left (at the recent rate); the replay's own
// figures, its GB/s among them, follow it.
func newBar(w io.Writer, total int) *progressbar.ProgressBar {
	b := progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetTheme(progressbar.ThemeASCII),
		progressbar.OptionFullWidth(),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionUseANSICodes(true))
	b.StartWithoutRender()
	return b
}

func (p *progress) loop(every time.Duration) {
	defer close(p.exited)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			p.draw(false)
		case <-p.quit:
			p.draw(true)
			return
		}
	}
}

// stop draws the final state and waits for the goroutine.
func (p *progress) stop() {
	if p.quit == nil {
		return
	}
	close(p.quit)
	<-p.exited
}

// figures are the replay's hit ratio and its bound, bytes read and
// written, and errors; rate is their GB/s.
func (p *progress) figures(elapsed time.Duration) (hit, bound, gb, rate float64, errs int64) {
	if b := p.c.blocks.Load(); b > 0 {
		hit = 100 * float64(p.c.hits.Load()) / float64(b)
		bound = 100 * float64(p.c.bound.Load()) / float64(b)
	}
	gb = float64(p.c.bytes.Load()) / 1e9
	return hit, bound, gb, gb / max(elapsed.Seconds(), 1e-9), p.c.errors.Load()
}

func (p *progress) draw(last bool) {
	done := int(p.c.done.Load())
	elapsed := time.Since(p.start)
	hit, bound, gb, rate, errs := p.figures(elapsed)
	if p.bar == nil {
		pct := 100.0
		if p.total > 0 {
			pct = 100 * float64(done) / float64(p.total)
		}
		fmt.Fprintf(p.w, "trace: %d/%d requests (%.0f%%), hit %.1f%% (bound %.1f%%), %.2f GB, %.2f GB/s, %d with errors, %v\n",
			done, p.total, pct, hit, bound, gb, rate, errs, elapsed.Round(time.Second))
		return
	}
	// Short, to leave the bar room on 80 columns. Errors of writing to
	// the terminal are ignored, as plain lines' are: progress is no
	// result.
	p.bar.Describe(fmt.Sprintf("hit %.1f%%/%.1f%% %.2f GB %.2f GB/s err %d", hit, bound, gb, rate, errs))
	_ = p.bar.Set(done)
	if last {
		// A bar stopped short (a failed or cancelled replay) stays as
		// it was; either way the line is kept.
		_ = p.bar.Exit()
		io.WriteString(p.w, "\n")
	}
}

package trace

import (
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/term"
)

// barEvery is how often the progress bar is redrawn on a terminal.
const barEvery = 250 * time.Millisecond

// progress draws the replay's state from its counters, on its own
// goroutine, which alone writes to w.
type progress struct {
	w      io.Writer
	fd     int // the terminal's, or -1 for plain lines
	total  int
	c      *counters
	start  time.Time
	quit   chan struct{}
	exited chan struct{}
}

// startProgress starts reporting to w, or does nothing if w is nil.
func startProgress(w io.Writer, every time.Duration, total int, c *counters, start time.Time) *progress {
	p := &progress{w: w, fd: -1, total: total, c: c, start: start}
	if w == nil {
		return p
	}
	if f, ok := w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
		p.fd, every = int(f.Fd()), barEvery
	}
	p.quit, p.exited = make(chan struct{}), make(chan struct{})
	go p.loop(every)
	return p
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

func (p *progress) draw(last bool) {
	done := p.c.done.Load()
	elapsed := time.Since(p.start)
	pct := 100.0
	if p.total > 0 {
		pct = 100 * float64(done) / float64(p.total)
	}
	var hit, bound float64
	if b := p.c.blocks.Load(); b > 0 {
		hit = 100 * float64(p.c.hits.Load()) / float64(b)
		bound = 100 * float64(p.c.bound.Load()) / float64(b)
	}
	gb := float64(p.c.bytes.Load()) / 1e9
	rate := gb / max(elapsed.Seconds(), 1e-9)
	if p.fd < 0 {
		fmt.Fprintf(p.w, "trace: %d/%d requests (%.0f%%), hit %.1f%% (bound %.1f%%), %.2f GB, %.2f GB/s, %d with errors, %v\n",
			done, p.total, pct, hit, bound, gb, rate, p.c.errors.Load(), elapsed.Round(time.Second))
		return
	}
	stats := fmt.Sprintf("%d/%d %3.0f%% hit %.1f%%/%.1f%% %.2f GB %.2f GB/s err %d",
		done, p.total, pct, hit, bound, gb, rate, p.c.errors.Load())
	if done > 0 && !last {
		left := time.Duration(float64(elapsed) * float64(p.total-int(done)) / float64(done))
		stats += " eta " + left.Round(time.Second).String()
	}
	width, _, err := term.GetSize(p.fd)
	if err != nil || width <= 0 {
		width = 80
	}
	// "[" bar "] " stats, one column short of the width so that the
	// terminal never wraps; no bar if it would be shorter than 10.
	line := "\r" + stats
	if n := width - len(stats) - 4; n >= 10 {
		fill := int(float64(n) * pct / 100)
		line = "\r[" + strings.Repeat("=", fill) + strings.Repeat(" ", n-fill) + "] " + stats
	} else if len(stats) >= width {
		line = "\r" + stats[:width-1]
	}
	line += "\x1b[K"
	if last {
		line += "\n"
	}
	io.WriteString(p.w, line)
}

package te

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Names of the yardstick measurements.
const memcpyName = "memcpy-1thread"

func tcpName(conns int) string { return fmt.Sprintf("loopback-tcp-%dconn", conns) }

// tcpConns are the connection counts the TCP yardstick streams over: as
// many as the engine has lanes, and one.
func (o Options) tcpConns() []int {
	if o.Lanes == 1 {
		return []int{1}
	}
	return []int{o.Lanes, 1}
}

// Phases names the measurements of one run, in the order Run makes them:
// ours, then the yardsticks of the transport (none with NoYardstick).
func (o Options) Phases() []string {
	o = o.withDefaults()
	names := []string{Ours}
	switch {
	case o.NoYardstick:
	case o.Transport == "shm":
		names = append(names, memcpyName)
	default:
		for _, n := range o.tcpConns() {
			names = append(names, tcpName(n))
		}
	}
	return names
}

// Planned is how long Run measures: Repeat runs of each phase for
// Duration. Starting the children and engines and the warm-up pass come
// on top (a second or so).
func (o Options) Planned() time.Duration {
	d := o.withDefaults()
	return time.Duration(d.Repeat*len(o.Phases())) * d.Duration
}

// PlanLine says what Run is about to do and for how long, so that a run
// longer than --duration surprises no one.
func (o Options) PlanLine() string {
	d := o.withDefaults()
	phases := o.Phases()
	return fmt.Sprintf("te: %d run(s) x %d measurement(s) (%s) x %v = %v of measuring, plus start-up",
		d.Repeat, len(phases), strings.Join(phases, ", "), d.Duration, o.Planned())
}

// barEvery is how often the progress bar is redrawn on a terminal.
const barEvery = 250 * time.Millisecond

// progress shows the benchmark's advance through its planned measuring
// time on w: on a terminal a progressbar (bar, time spent and left) with
// the measurement under way and its rate; elsewhere (a log, a pipe) a
// plain line a second.
type progress struct {
	w        io.Writer // nil: nothing is shown
	bar      *progressbar.ProgressBar
	repeat   int
	duration time.Duration
	total    time.Duration // planned measuring time
	// done is the planned time of the measurements finished.
	done time.Duration
}

// startProgress writes o's plan line to o.Progress and returns what shows
// the measurements' progress there (nothing if o.Progress is nil).
func startProgress(o Options) *progress {
	p := &progress{w: o.Progress, repeat: o.Repeat, duration: o.Duration, total: o.Planned()}
	if p.w == nil {
		return p
	}
	fmt.Fprintln(p.w, o.PlanLine())
	if f, ok := p.w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = newBar(p.w, p.total)
	}
	return p
}

// newBar is a bar over total measuring time, as wide as the terminal,
// with the time spent and left; the measurement under way and its rate
// follow it.
func newBar(w io.Writer, total time.Duration) *progressbar.ProgressBar {
	b := progressbar.NewOptions64(total.Milliseconds(),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetTheme(progressbar.ThemeASCII),
		progressbar.OptionFullWidth(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionUseANSICodes(true))
	b.StartWithoutRender()
	return b
}

// meter shows the measurement name of run, whose bytes moved counts,
// until the returned func is called.
func (p *progress) meter(run int, name string, moved *atomic.Uint64) (stop func()) {
	if p.w == nil {
		return func() {}
	}
	every := time.Second
	if p.bar != nil {
		every = barEvery
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		start, last, lastT := time.Now(), uint64(0), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := moved.Load()
				rate := float64(n-last) / now.Sub(lastT).Seconds() / 1e9
				last, lastT = n, now
				p.draw(run, name, now.Sub(start), rate)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		p.done += p.duration
		if p.bar != nil {
			_ = p.bar.Set64(p.done.Milliseconds())
		}
	}
}

// draw shows that measurement name of run has taken elapsed, at rate
// GB/s. Errors of writing are ignored: progress is no result.
func (p *progress) draw(run int, name string, elapsed time.Duration, rate float64) {
	if p.bar == nil {
		fmt.Fprintf(p.w, "te: run %d/%d %-20s %5.1fs %8.3f GB/s (%v of %v)\n", run, p.repeat, name,
			elapsed.Seconds(), rate, (p.done + min(elapsed, p.duration)).Round(time.Second),
			p.total)
		return
	}
	p.bar.Describe(fmt.Sprintf("run %d/%d %s %.2f GB/s", run, p.repeat, name, rate))
	_ = p.bar.Set64((p.done + min(elapsed, p.duration)).Milliseconds())
}

// stop ends the bar, keeping its last state on its line.
func (p *progress) stop() {
	if p.bar != nil {
		_ = p.bar.Exit()
		io.WriteString(p.w, "\n")
	}
}

package trace

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints r as an aligned, human-readable summary. The yardstick
// is the infinite-cache bound: the last line is the hit ratio's share of it.
func (r *Result) WriteTable(out io.Writer) error {
	speed := "as fast as possible"
	if r.Speedup > 0 {
		speed = fmt.Sprintf("trace time / %g", r.Speedup)
	}
	fmt.Fprintf(out, "Trace replay: %d requests, block %s (scaled down from %s), concurrency %d, %s\n",
		r.Requests, size(r.BlockBytes), size(RealBlockBytes), r.Concurrency, speed)
	fmt.Fprintf(out, "keys %q + hash id; GB = 1e9 bytes\n\n", r.KeyPrefix)
	// Rows without a note would end in padding: the table goes through a
	// buffer that trims it.
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	row := func(what, value, note string) { fmt.Fprintf(tw, "%s\t%s\t%s\n", what, value, note) }
	pct := func(n int64) string {
		if r.Blocks == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(r.Blocks))
	}
	row("input blocks", fmt.Sprint(r.Blocks), "")
	row("hit blocks", fmt.Sprint(r.HitBlocks), pct(r.HitBlocks)+" hit ratio")
	row("infinite-cache bound", fmt.Sprint(r.InfiniteHitBlocks), pct(r.InfiniteHitBlocks)+" hit ratio")
	row("blocks put", fmt.Sprint(r.PutBlocks), "")
	row("GB read", fmt.Sprintf("%.3f", float64(r.BytesRead)/1e9), "")
	row("GB written", fmt.Sprintf("%.3f", float64(r.BytesWritten)/1e9), "")
	row("seconds", fmt.Sprintf("%.2f", r.Seconds), "wall")
	row("GB/s", fmt.Sprintf("%.3f", r.GBPerS), "read + written over wall time")
	row("get latency", latencies(r.GetP50, r.GetP99), fmt.Sprintf("%d BatchGet calls", r.Gets))
	row("put latency", latencies(r.PutP50, r.PutP99), fmt.Sprintf("%d BatchPut calls", r.Puts))
	if r.Speedup > 0 {
		row("max lag", round(r.MaxLag).String(), "behind the scaled trace")
	}
	row("corrupt blocks", fmt.Sprint(r.Corrupt), "")
	row("failed", fmt.Sprintf("%d / %d / %d", r.FailedExists, r.FailedGets, r.FailedPuts),
		"BatchExist calls / get keys / put keys")
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(table.String()) {
		if _, err := io.WriteString(out, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	if r.InfiniteHitBlocks == 0 {
		_, err := fmt.Fprintln(out, "\nratio hit / infinite bound: - (no block is ever reused)")
		return err
	}
	_, err := fmt.Fprintf(out, "\nratio hit / infinite bound = %.3f\n",
		float64(r.HitBlocks)/float64(r.InfiniteHitBlocks))
	return err
}

func latencies(p50, p99 time.Duration) string {
	return fmt.Sprintf("p50 %v p99 %v", round(p50), round(p99))
}

// round keeps three or four significant digits of d.
func round(d time.Duration) time.Duration {
	for unit := time.Second; unit >= 10*time.Nanosecond; unit /= 10 {
		if d >= 1000*unit {
			return d.Round(unit)
		}
	}
	return d
}

// size prints a byte count in the largest binary unit that divides it.
func size(n int) string {
	for _, u := range []struct {
		shift int
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

package te

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints r as an aligned, human-readable report.
func (r Result) WriteTable(out io.Writer) error {
	slice := "engine default"
	if r.SliceSize != 0 {
		slice = Size(r.SliceSize).String()
	}
	fmt.Fprintf(out, "Transfer Engine benchmark: %s %s, block %s, batch %d, threads %d, lanes %d, slice %s\n",
		r.Transport, r.Op, Size(r.BlockSize), r.BatchSize, r.Threads, r.Lanes, slice)
	mem := "host memory"
	if r.Memory != "" {
		mem = r.Memory + " (the yardstick moves host memory)"
	}
	fmt.Fprintf(out, "buffer %s each side in %s, target %s, runs %d x %gs; GB = 1e9 bytes\n",
		Size(r.BufferSize), mem, r.Target, r.Repeat, r.Duration)
	fmt.Fprintf(out, "latency: %s\n", r.Latency)
	fmt.Fprintf(out, "AllocateBatch+FreeBatch: %.1f µs per batch (counted in GB/s, not in latency)\n\n", r.BatchOverheadUS)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\twhat\tseconds\tGB\tGB/s\trequests\tp50 µs\tp99 µs\t")
	row := func(run, name string, f Figures) {
		if f.Requests == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.3f\t-\t-\t-\t\n", run, name, f.Seconds, float64(f.Bytes)/1e9, f.GBPerS)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.3f\t%d\t%.0f\t%.0f\t\n", run, name, f.Seconds,
			float64(f.Bytes)/1e9, f.GBPerS, f.Requests, f.P50us, f.P99us)
	}
	for _, f := range r.Runs {
		row(fmt.Sprint(f.Run), f.Name, f)
	}
	row("median", Ours, Figures{Seconds: r.Seconds, Bytes: r.Bytes, GBPerS: r.GBPerS, Requests: r.Requests,
		P50us: r.P50us, P99us: r.P99us})
	if r.YardstickName == "" {
		return tw.Flush()
	}
	fmt.Fprintf(tw, "median\t%s\t\t\t%.3f\t\t\t\t\n", r.YardstickName, r.YardstickGBPerS)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(out, "\nratio ours / %s = %.3f\n", r.YardstickName, r.Ratio)
	return err
}

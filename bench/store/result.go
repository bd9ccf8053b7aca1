package store

import (
	"cmp"
	"fmt"
	"github.com/mooncake-go/mooncake/internal/hist"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/mooncake-go/mooncake/bench/te"
)

// Names of the systems this package measures. Our own store, measured
// through Drive by its caller, should call itself Ours.
const (
	Ours     = "mooncake-go"
	Redis    = "redis"
	Official = "official"
)

// Topologies of the official yardstick (see OfficialConfig.Topology).
const (
	Remote = "remote"
	Local  = "local"
)

// Result is one run's figures. GB/s counts the objects' bytes, 1e9 to the
// GB; keys and protocol overhead are not counted.
type Result struct {
	Name string `json:"name"` // the system: Ours, Redis, Official
	// Topology is where the data lives relative to the clients, for the
	// systems that have a choice: Remote or Local. Empty otherwise.
	Topology  string `json:"topology,omitempty"`
	Op        string `json:"op"`
	ValueSize int    `json:"value_size"`
	BatchSize int    `json:"batch_size"`
	Clients   int    `json:"clients"`
	Keys      int    `json:"keys"` // the working set of a get run

	Seconds float64 `json:"seconds"` // the clock, from start to the end of the last call
	Calls   uint64  `json:"calls"`   // put or get calls, each of BatchSize objects
	Ops     uint64  `json:"ops"`     // objects put or got
	Bytes   uint64  `json:"bytes"`   // Ops * ValueSize
	OpsPerS float64 `json:"ops_per_s"`
	GBPerS  float64 `json:"gb_per_s"`
	// P50us and P99us are quantiles of the latency of one call (a whole
	// batch), in microseconds.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

// fill sets the derived figures from Calls, Seconds and the options.
func (r *Result) fill(o Options, h *hist.Histogram) {
	r.Op, r.ValueSize, r.BatchSize, r.Clients, r.Keys = o.Op, o.ValueSize, o.BatchSize, o.Clients, o.Keys
	r.Ops = r.Calls * uint64(o.BatchSize)
	r.Bytes = r.Ops * uint64(o.ValueSize)
	if r.Seconds > 0 {
		r.OpsPerS = float64(r.Ops) / r.Seconds
		r.GBPerS = float64(r.Bytes) / r.Seconds / 1e9
	}
	r.P50us, r.P99us = micros(h.Quantile(0.5)), micros(h.Quantile(0.99))
}

// point identifies the workload of a result, whatever measured it.
type point struct {
	op                   string
	value, batch, client int
}

func (r Result) point() point { return point{r.Op, r.ValueSize, r.BatchSize, r.Clients} }

// Median returns the run with the median throughput (the lower middle one
// for an even count), so that its latencies come from the same run. It
// returns the zero Result for none.
func Median(runs []Result) Result {
	if len(runs) == 0 {
		return Result{}
	}
	s := slices.Clone(runs)
	slices.SortStableFunc(s, func(a, b Result) int { return cmp.Compare(a.GBPerS, b.GBPerS) })
	return s[(len(s)-1)/2]
}

// WriteTable prints rs as an aligned table, one row each in the order
// given, with the ratio of each row's GB/s to that of the first row of
// system base at the same op, value size, batch size and clients ("-"
// where there is none).
func WriteTable(out io.Writer, rs []Result, base string) error {
	ref := map[point]Result{}
	for _, r := range rs {
		if _, ok := ref[r.point()]; !ok && r.Name == base {
			ref[r.point()] = r
		}
	}
	fmt.Fprintf(out, "Store benchmark: GB = 1e9 bytes of values; latency per call (one batch); ratio = GB/s / %s GB/s\n", base)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "system\ttopology\top\tvalue\tbatch\tclients\tseconds\tops/s\tGB/s\tp50 µs\tp99 µs\tx %s\t\n", base)
	for _, r := range rs {
		ratio := "-"
		if b, ok := ref[r.point()]; ok && b.GBPerS > 0 {
			ratio = fmt.Sprintf("%.2f", r.GBPerS/b.GBPerS)
		}
		topo := r.Topology
		if topo == "" {
			topo = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.3f\t%.0f\t%.0f\t%s\t\n", r.Name, topo, r.Op,
			te.Size(r.ValueSize), r.BatchSize, r.Clients, r.Seconds, r.OpsPerS, r.GBPerS, r.P50us, r.P99us, ratio)
	}
	return tw.Flush()
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / 1e3 }

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
	// The floors: what the same calls cost at best over loopback TCP
	// (RunTCP, topology Remote) and in shared memory (RunMemcpy, topology
	// SameHost).
	TCP    = "tcp"
	Memcpy = "memcpy"
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
	// XTCP and XMemcpy are GB/s over that of the tcp and memcpy floors at
	// the same op, value size, batch size and clients, set by FloorRatios
	// where that floor was measured (zero, and left out of JSON, where it
	// was not). They read against a row of the floor's topology: XTCP for
	// the systems whose bytes cross loopback TCP (remote, redis), XMemcpy
	// for same-host and local ones.
	XTCP    float64 `json:"x_tcp,omitempty"`
	XMemcpy float64 `json:"x_memcpy,omitempty"`
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

// refs maps each point to the first row of system name there.
func refs(rs []Result, name string) map[point]Result {
	ref := map[point]Result{}
	for _, r := range rs {
		if _, ok := ref[r.point()]; !ok && r.Name == name {
			ref[r.point()] = r
		}
	}
	return ref
}

// ratio is r's GB/s over that of ref's row at r's point; ok is false where
// there is none.
func ratio(ref map[point]Result, r Result) (x float64, ok bool) {
	b, ok := ref[r.point()]
	if !ok || b.GBPerS <= 0 {
		return 0, false
	}
	return r.GBPerS / b.GBPerS, true
}

// FloorRatios sets XTCP and XMemcpy of every result in rs from the first
// TCP and Memcpy rows at its point, where there is one.
func FloorRatios(rs []Result) {
	tcp, mem := refs(rs, TCP), refs(rs, Memcpy)
	for i := range rs {
		rs[i].XTCP, _ = ratio(tcp, rs[i])
		rs[i].XMemcpy, _ = ratio(mem, rs[i])
	}
}

// WriteTable prints rs as an aligned table, one row each in the order
// given, with the ratio of each row's GB/s to that of the first row of
// system base at the same op, value size, batch size and clients ("-"
// where there is none). Where rs holds rows of the floors (TCP, Memcpy),
// a column for each gives the ratio to it the same way: "x tcp" is the one
// to read for rows whose bytes cross loopback TCP (remote, redis),
// "x memcpy" for same-host and local rows.
func WriteTable(out io.Writer, rs []Result, base string) error {
	cols := []string{base}
	for _, f := range []string{TCP, Memcpy} {
		if f != base && slices.ContainsFunc(rs, func(r Result) bool { return r.Name == f }) {
			cols = append(cols, f)
		}
	}
	ref := make([]map[point]Result, len(cols))
	for i, c := range cols {
		ref[i] = refs(rs, c)
	}
	fmt.Fprintf(out, "Store benchmark: GB = 1e9 bytes of values; latency per call (one batch); ratio = GB/s / %s GB/s\n", base)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "system\ttopology\top\tvalue\tbatch\tclients\tseconds\tops/s\tGB/s\tp50 µs\tp99 µs\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "x %s\t", c)
	}
	fmt.Fprintln(tw)
	for _, r := range rs {
		topo := r.Topology
		if topo == "" {
			topo = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.3f\t%.0f\t%.0f\t", r.Name, topo, r.Op,
			te.Size(r.ValueSize), r.BatchSize, r.Clients, r.Seconds, r.OpsPerS, r.GBPerS, r.P50us, r.P99us)
		for i := range cols {
			if x, ok := ratio(ref[i], r); ok {
				fmt.Fprintf(tw, "%.2f\t", x)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / 1e3 }

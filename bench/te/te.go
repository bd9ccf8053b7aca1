package te

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
)

// Options configures a benchmark. Zero fields take the defaults named.
type Options struct {
	// Transport is the engine's data path: "tcp" or "shm". Zero: "tcp".
	Transport string
	// Op is the direction of every request. Zero: engine.Read.
	Op engine.Op
	// BlockSize is the length of one request. Zero: 1 MiB.
	BlockSize int
	// BatchSize is the number of requests submitted and awaited together.
	// Zero: 64.
	BatchSize int
	// Threads is the number of workers, each with its own batches. Zero: 1.
	Threads int
	// Duration is the length of one measurement. Zero: 5 s.
	Duration time.Duration
	// BufferSize is the size of the local and the target buffer; requests
	// cycle through it. Zero: Threads*BatchSize*BlockSize capped at 1 GiB,
	// and never less than one batch.
	BufferSize int
	// Lanes is the engine's TCP connections per peer (engine.Config.Lanes)
	// and the connection count of the wider TCP yardstick. Zero: the
	// engine's default (MC_TCP_LANES_PER_PEER, else 4).
	Lanes int
	// SliceSize is engine.Config.SliceSize. Zero: the engine's 128 KiB.
	SliceSize uint64
	// Repeat is how many times ours and the yardstick are measured, in
	// turn; the report gives medians. Zero: 3.
	Repeat int
	// NoYardstick measures ours only (to profile the engine alone); the
	// yardstick figures and the ratio stay zero.
	NoYardstick bool
	// UseVRAM puts both buffers in GPU memory (GPUID's), as the official
	// bench's --use_vram: device to device through the engine, against the
	// host-to-host yardstick of the same run.
	UseVRAM bool
	GPUID   int
	// Launcher starts the target and the sink. Zero: InProcess.
	Launcher Launcher
	// Metadata is the initiator engine's metadata service
	// (engine.Config.Metadata), for a target that publishes its segment
	// there: one started elsewhere, as official transfer_engine_bench's
	// --mode target. Zero: P2PHANDSHAKE.
	Metadata string
	// MemcpySpan is how much memory the memcpy yardstick cycles through.
	// Zero: the larger of MemcpySpan (256 MiB) and BufferSize.
	MemcpySpan int
	// TargetCPUProfile, when set, is where a target child process writes
	// its CPU profile (see TargetConfig.CPUProfile).
	TargetCPUProfile string
	// Progress, when set, receives the plan (PlanLine) first, then the
	// advance through it: a progress bar on a terminal, else a line a
	// second while measuring.
	Progress io.Writer
	// Logger is our engine's logger. Zero: slog.Default().
	Logger *slog.Logger
}

// MaxDefaultBuffer caps the default BufferSize.
const MaxDefaultBuffer = 1 << 30

// gpu is the GPU of both buffers, -1 for host memory.
func (o Options) gpu() int {
	if o.UseVRAM {
		return o.GPUID
	}
	return -1
}

func (o Options) withDefaults() Options {
	o.Transport = cmp.Or(o.Transport, "tcp")
	o.BlockSize = cmp.Or(o.BlockSize, 1<<20)
	o.BatchSize = cmp.Or(o.BatchSize, 64)
	o.Threads = cmp.Or(o.Threads, 1)
	o.Duration = cmp.Or(o.Duration, 5*time.Second)
	if o.BufferSize == 0 {
		batch := o.BatchSize * o.BlockSize
		o.BufferSize = max(min(o.Threads*batch, MaxDefaultBuffer), batch)
	}
	if o.Lanes == 0 {
		// The engine's own default, which the yardstick must match.
		o.Lanes = 4
		if v, err := strconv.Atoi(os.Getenv("MC_TCP_LANES_PER_PEER")); err == nil && v > 0 {
			o.Lanes = v
		}
	}
	o.Repeat = cmp.Or(o.Repeat, 3)
	if o.Launcher == nil {
		o.Launcher = InProcess{Logger: o.Logger}
	}
	o.MemcpySpan = cmp.Or(o.MemcpySpan, max(MemcpySpan, o.BufferSize))
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.Transport != "" && o.Transport != "tcp" && o.Transport != "shm":
		return fmt.Errorf("te: Transport %q (want tcp or shm)", o.Transport)
	case o.Op != engine.Read && o.Op != engine.Write:
		return fmt.Errorf("te: Op %d (want read or write)", o.Op)
	case o.BlockSize < 0:
		return fmt.Errorf("te: BlockSize %d", o.BlockSize)
	case o.BatchSize < 0:
		return fmt.Errorf("te: BatchSize %d", o.BatchSize)
	case o.Threads < 0:
		return fmt.Errorf("te: Threads %d", o.Threads)
	case o.Duration < 0:
		return fmt.Errorf("te: Duration %v", o.Duration)
	case o.BufferSize < 0 || (o.BufferSize > 0 && o.BufferSize < max(o.BlockSize, 1)):
		return fmt.Errorf("te: BufferSize %d (at least one block)", o.BufferSize)
	case o.Lanes < 0 || o.Lanes > 64:
		return fmt.Errorf("te: Lanes %d (0..64)", o.Lanes)
	case o.SliceSize != 0 && o.SliceSize < 4096:
		return fmt.Errorf("te: SliceSize %d (at least 4096)", o.SliceSize)
	case o.Repeat < 0:
		return fmt.Errorf("te: Repeat %d", o.Repeat)
	case o.MemcpySpan < 0 || (o.MemcpySpan > 0 && o.MemcpySpan < max(o.BlockSize, 1)):
		return fmt.Errorf("te: MemcpySpan %d (at least one block)", o.MemcpySpan)
	}
	return nil
}

// Figures are one measurement.
type Figures struct {
	Run      int     `json:"run"`  // 1-based repeat
	Name     string  `json:"name"` // "ours" or the yardstick's name
	Seconds  float64 `json:"seconds"`
	Bytes    uint64  `json:"bytes"`
	GBPerS   float64 `json:"gb_per_s"` // 1e9 bytes per second
	Requests uint64  `json:"requests,omitempty"`
	P50us    float64 `json:"p50_us,omitempty"`
	P99us    float64 `json:"p99_us,omitempty"`
	// BatchOverheadUS is the mean time per batch in AllocateBatch and
	// FreeBatch (a batch cannot be reused: it holds BatchSize tasks over its
	// lifetime). It is inside the throughput figures, outside the latency.
	BatchOverheadUS float64 `json:"batch_overhead_us,omitempty"`
}

// Ours names our engine's figures.
const Ours = "ours"

// LatencyDefinition says what the latency figures measure.
const LatencyDefinition = "per request, from Submit to the return of Wait on its batch"

// Result is the outcome of a benchmark: the setup, our median run, the
// yardstick's median and every run.
type Result struct {
	Transport  string  `json:"transport"`
	Op         string  `json:"op"`
	BlockSize  int     `json:"block_size"`
	BatchSize  int     `json:"batch_size"`
	Threads    int     `json:"threads"`
	Lanes      int     `json:"lanes"`
	SliceSize  uint64  `json:"slice_size,omitempty"`
	BufferSize int     `json:"buffer_size"`
	Duration   float64 `json:"duration_s"` // asked for, per run
	Repeat     int     `json:"repeat"`
	Target     string  `json:"target"` // "process", "in-process" or "external"
	// Memory is where both buffers are: "" for host memory, "cuda:N".
	Memory string `json:"memory,omitempty"`

	// Our run with the median throughput.
	Seconds  float64 `json:"seconds"`
	Bytes    uint64  `json:"bytes"`
	Requests uint64  `json:"requests"`
	GBPerS   float64 `json:"gb_per_s"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	Latency  string  `json:"latency"` // LatencyDefinition
	// BatchOverheadUS: see Figures.
	BatchOverheadUS float64 `json:"batch_overhead_us"`

	// The yardstick with the best median throughput, and ours over it.
	YardstickName   string  `json:"yardstick_name"`
	YardstickGBPerS float64 `json:"yardstick_gb_per_s"`
	Ratio           float64 `json:"ratio"`

	Runs []Figures `json:"runs"`
}

// Run measures our engine and the yardstick of its transport, Repeat times
// each, interleaved, and reports the medians. Any failed request aborts it.
func Run(ctx context.Context, o Options) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.withDefaults()
	res = Result{
		Transport: o.Transport, Op: o.Op.String(), BlockSize: o.BlockSize, BatchSize: o.BatchSize,
		Threads: o.Threads, Lanes: o.Lanes, SliceSize: o.SliceSize, BufferSize: o.BufferSize,
		Duration: o.Duration.Seconds(), Repeat: o.Repeat, Target: "in-process", Latency: LatencyDefinition,
	}
	if o.UseVRAM {
		res.Memory = fmt.Sprintf("cuda:%d", o.GPUID)
	}
	switch o.Launcher.(type) {
	case Exec:
		res.Target = "process"
	case InProcess:
	default:
		res.Target = "external" // started by someone else (a remote target)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr := startProgress(o)
	defer pr.stop()
	// Deferred closes run in reverse: our engine first, the target last.
	tinfo, tcloser, err := o.Launcher.StartTarget(ctx, TargetConfig{Transport: o.Transport, BufferSize: o.BufferSize,
		CPUProfile: o.TargetCPUProfile, Logger: o.Logger, GPU: o.gpu()})
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, tcloser.Close()) }()

	yard, cleanup, err := o.yardstick(ctx, pr)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()

	w, err := newWorkload(ctx, o, tinfo)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, w.close()) }()
	// One untimed pass over the buffers: lanes dial, the same-host path
	// maps the target's pages.
	if err := w.warmUp(ctx); err != nil {
		return Result{}, err
	}
	for run := 1; run <= o.Repeat; run++ {
		var moved atomic.Uint64
		stop := pr.meter(run, Ours, &moved)
		f, err := w.measure(ctx, &moved)
		stop()
		if err != nil {
			return Result{}, err
		}
		f.Run, f.Name = run, Ours
		res.Runs = append(res.Runs, f)
		y, err := yard(ctx, run)
		if err != nil {
			return Result{}, err
		}
		res.Runs = append(res.Runs, y...)
	}
	res.summarise()
	return res, nil
}

// yardstick prepares the yardstick of o.Transport: measure runs it once
// (shown by pr), cleanup releases what it holds.
func (o Options) yardstick(ctx context.Context, pr *progress) (measure func(ctx context.Context, run int) ([]Figures, error),
	cleanup func() error, err error) {
	none := func() error { return nil }
	switch {
	case o.NoYardstick:
		return func(context.Context, int) ([]Figures, error) { return nil, nil }, none, nil
	case o.Transport == "shm":
		src, dst, free, err := NewMemcpyBuffers(o.MemcpySpan)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, run int) ([]Figures, error) {
			const name = memcpyName
			var moved atomic.Uint64
			stop := pr.meter(run, name, &moved)
			f, err := MemcpyYardstick(ctx, MemcpyOptions{Chunk: o.BlockSize, Src: src, Dst: dst,
				Duration: o.Duration, Progress: &moved})
			stop()
			f.Run, f.Name = run, name
			return []Figures{f}, err
		}, func() error { free(); return nil }, nil
	}
	sink, scloser, err := o.Launcher.StartSink(ctx, SinkConfig{BufferSize: o.BufferSize})
	if err != nil {
		return nil, nil, err
	}
	local, err := mapAnon(o.BufferSize)
	if err != nil {
		return nil, nil, errors.Join(err, scloser.Close())
	}
	conns := o.tcpConns()
	return func(ctx context.Context, run int) ([]Figures, error) {
			var out []Figures
			for _, n := range conns {
				name := tcpName(n)
				var moved atomic.Uint64
				stop := pr.meter(run, name, &moved)
				f, err := TCPYardstick(ctx, TCPOptions{Addr: sink.Addr, Conns: n, Op: o.Op, Chunk: o.BlockSize,
					Buffer: local, SinkBuffer: o.BufferSize, Duration: o.Duration, Progress: &moved})
				stop()
				if err != nil {
					return nil, err
				}
				f.Run, f.Name = run, name
				out = append(out, f)
			}
			return out, nil
		}, func() error {
			return errors.Join(unix.Munmap(local), scloser.Close())
		}, nil
}

// summarise picks our median run and the best yardstick median.
func (r *Result) summarise() {
	byName := map[string][]Figures{}
	var names []string
	for _, f := range r.Runs {
		if _, ok := byName[f.Name]; !ok && f.Name != Ours {
			names = append(names, f.Name)
		}
		byName[f.Name] = append(byName[f.Name], f)
	}
	ours := median(byName[Ours])
	r.Seconds, r.Bytes, r.Requests, r.GBPerS, r.P50us, r.P99us, r.BatchOverheadUS =
		ours.Seconds, ours.Bytes, ours.Requests, ours.GBPerS, ours.P50us, ours.P99us, ours.BatchOverheadUS
	for _, n := range names {
		if m := median(byName[n]); m.GBPerS > r.YardstickGBPerS {
			r.YardstickName, r.YardstickGBPerS = n, m.GBPerS
		}
	}
	if r.YardstickGBPerS > 0 {
		r.Ratio = r.GBPerS / r.YardstickGBPerS
	}
}

// median returns the run with the median throughput (the lower middle one
// for an even count).
func median(fs []Figures) Figures {
	if len(fs) == 0 {
		return Figures{}
	}
	s := slices.Clone(fs)
	slices.SortFunc(s, func(a, b Figures) int {
		switch {
		case a.GBPerS < b.GBPerS:
			return -1
		case a.GBPerS > b.GBPerS:
			return 1
		}
		return 0
	})
	return s[(len(s)-1)/2]
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/bench/te"
	"github.com/mooncake-go/mooncake/engine"
)

// Hidden commands under "bench te" that the benchmark re-executes itself as.
var (
	benchTETargetArgs = []string{"bench", "te", "target"}
	benchTESinkArgs   = []string{"bench", "te", "tcp-sink"}
)

func newBenchTECmd() *cobra.Command {
	var (
		o          te.Options
		transport  string
		op         string
		block      = te.Size(1 << 20)
		buffer     te.Size
		slice      te.Size
		asJSON     bool
		inProcess  bool
		cpuprofile string
		official   benchTEOfficial // bench_te_official.go
	)
	c := &cobra.Command{
		Use:   "te",
		Short: "Benchmark the Transfer Engine against loopback TCP or memcpy",
		Long: `Runs a target engine in a child process (or in this one with --in-process)
and an initiator here whose --threads workers submit batches of --batch-size
requests of --block-size bytes, for --duration, --repeat times. After each
run the yardstick of the transport runs for as long: loopback TCP streams to
a sink child process (as many connections as lanes, and one) for tcp, a
single-thread memcpy for shm. The report gives medians and ours/yardstick.

So a run measures --repeat x (1 + yardsticks) x --duration: 3 x 3 x 5s = 45s
for tcp by default, plus start-up. The plan is printed first, then the
progress (a bar on a terminal), both on stderr; the report alone goes to
stdout.

Official transfer_engine_bench's flags work too (--block_size, --batch_size,
--buffer_size, --operation, --protocol, a --duration in seconds), and so do
its two processes: --mode target serves a buffer under --local_server_name
in --metadata_server until SIGINT, and an initiator given --segment_id
measures against that target (no yardstick) instead of starting its own.`,
		Example: `  mooncake bench te --transport tcp --op write --block-size 1MiB --threads 2
  mooncake bench te --transport shm --op read --block-size 4MiB --json
  mooncake bench te --mode target --metadata_server http://127.0.0.1:8080/metadata --local_server_name 127.0.0.1:12345
  mooncake bench te --metadata_server http://127.0.0.1:8080/metadata --segment_id 127.0.0.1:12345 --operation write --duration 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := official.apply(cmd.Flags(), &transport, &op); err != nil {
				return err
			}
			switch transport {
			case "tcp", "shm":
				o.Transport = transport
			default:
				return fmt.Errorf("--transport %q: want tcp or shm", transport)
			}
			switch op {
			case "read":
				o.Op = engine.Read
			case "write":
				o.Op = engine.Write
			default:
				return fmt.Errorf("--op %q: want read or write", op)
			}
			o.BlockSize, o.BufferSize, o.SliceSize = int(block), int(buffer), uint64(slice)
			if o.BlockSize <= 0 || o.BatchSize <= 0 || o.Threads <= 0 || o.Duration <= 0 || o.Repeat <= 0 {
				return fmt.Errorf("--block-size, --batch-size, --threads, --duration and --repeat must be positive")
			}
			quietEngines(cmd)
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if inProcess {
				o.Launcher = te.InProcess{}
			} else {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find own binary to run the target: %w", err)
				}
				o.Launcher = te.Exec{Path: exe, Target: benchTETargetArgs, Sink: benchTESinkArgs,
					Args: []string{"--log-level", slogLevel().String()}}
				if cpuprofile != "" {
					o.TargetCPUProfile = cpuprofile + ".target"
				}
			}
			if done, err := official.runOfficialModes(cmd, ctx, &o); done || err != nil {
				return err
			}
			// The plan and the progress go to stderr, the report alone to
			// stdout, so that --json stays one parseable object.
			o.Progress = cmd.ErrOrStderr()
			if cpuprofile != "" {
				stopProfile, err := startCPUProfile(cpuprofile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			res, err := te.Run(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			return res.WriteTable(cmd.OutOrStdout())
		},
	}
	f := c.Flags()
	f.StringVar(&transport, "transport", "tcp", "engine data path: tcp or shm")
	f.StringVar(&op, "op", "write", "request direction: read or write")
	f.Var(&block, "block-size", "bytes per request (4096, 128KiB, 4MB, 1M; units are 1024-based)")
	f.IntVar(&o.BatchSize, "batch-size", 64, "requests per batch")
	f.IntVar(&o.Threads, "threads", 1, "submitting workers")
	o.Duration = 5 * time.Second
	f.Var(secondsValue{&o.Duration}, "duration", "length of each run (5s, 1m; a bare number is seconds, as the official bench's)")
	f.Var(&buffer, "buffer-size", "buffer on each side (default threads*batch*block, at most 1GiB, at least one batch)")
	f.IntVar(&o.Lanes, "lanes", 0, "TCP connections per peer (0: engine default, 4)")
	f.Var(&slice, "slice-size", "largest piece a request is cut into (0: engine default, 128KiB)")
	f.IntVar(&o.Repeat, "repeat", 3, "runs of ours and of the yardstick; medians are reported")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of the table")
	f.BoolVar(&inProcess, "in-process", false, "run the target and the TCP sink in this process")
	f.BoolVar(&o.NoYardstick, "no-yardstick", false, "measure ours only, to profile the engine alone")
	f.BoolVar(&o.UseVRAM, "use_vram", false, "both buffers in GPU memory (the CUDA driver, or MC_CUDA_DRIVER)")
	f.IntVar(&o.GPUID, "gpu_id", 0, "the GPU of --use_vram")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process here (and of the target to FILE.target)")
	official.bindFlags(f, &block, &buffer, &o)
	c.AddCommand(newBenchTETargetCmd(), newBenchTESinkCmd())
	return c
}

func newBenchTETargetCmd() *cobra.Command {
	var cfg te.TargetConfig
	c := &cobra.Command{
		Use:    "target",
		Short:  "Benchmark target: an engine with one buffer, until stdin closes",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := childContext(cmd)
			defer stop()
			return te.ServeTarget(ctx, cfg, cmd.OutOrStdout())
		},
	}
	cfg.BindFlags(c.Flags())
	return c
}

func newBenchTESinkCmd() *cobra.Command {
	var cfg te.SinkConfig
	c := &cobra.Command{
		Use:    "tcp-sink",
		Short:  "Loopback TCP sink of the benchmark yardstick, until stdin closes",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := childContext(cmd)
			defer stop()
			return te.ServeSink(ctx, cfg, cmd.OutOrStdout())
		},
	}
	cfg.BindFlags(c.Flags())
	return c
}

// childContext ends when stdin closes (the parent is done or died) or on
// SIGINT/SIGTERM.
func childContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		io.Copy(io.Discard, cmd.InOrStdin())
		cancel()
	}()
	return ctx, func() { cancel(); stop() }
}

// quietEngines keeps the engines' start-up logs out of the report unless a
// log level was asked for.
func quietEngines(cmd *cobra.Command) {
	if f := cmd.Flag("log-level"); (f != nil && f.Changed) || os.Getenv("MC_LOG_LEVEL") != "" {
		return
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// slogLevel is the level in effect, passed on to child processes.
func slogLevel() slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if slog.Default().Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError
}

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// writeAllocsProfile writes the allocations made so far (pprof's allocs
// profile: objects and bytes by call stack) to path.
func writeAllocsProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("--memprofile: %w", err)
	}
	return f.Close()
}

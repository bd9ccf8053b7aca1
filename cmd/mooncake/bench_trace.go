package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/bench/te"
	"github.com/mooncake-go/mooncake/bench/trace"
	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/cluster"
)

// storeAdapter lets the trace replay drive a store client.
type storeAdapter struct{ c *client.Client }

var _ trace.Store = storeAdapter{}

func (a storeAdapter) BatchExist(ctx context.Context, keys []string) ([]bool, error) {
	ok, errs := a.c.BatchExist(ctx, keys)
	return ok, errors.Join(errs...)
}

func (a storeAdapter) BatchGet(ctx context.Context, keys []string, dst [][]byte) []error {
	_, errs := a.c.BatchGetInto(ctx, keys, dst)
	return errs
}

// BatchPut is write-once: a block another request wrote (or is writing)
// already is a success, as the client reports it.
func (a storeAdapter) BatchPut(ctx context.Context, keys []string, values [][]byte) []error {
	return a.c.BatchPut(ctx, keys, values, nil)
}

// nodeLogName is the file in the output directory that the storage node
// processes of bench trace log to.
const nodeLogName = "nodes.log"

// createNodeLog creates (or truncates) dir's node log, dir included.
func createNodeLog(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.Create(filepath.Join(dir, nodeLogName))
}

func newBenchTraceCmd() *cobra.Command {
	var (
		o        trace.Options
		path     string
		block    string
		masterAt string
		nodes    int
		segment  string
		outDir   string
		noHA     bool
		inProc   bool
	)
	c := &cobra.Command{
		Use:   "trace",
		Short: "Replay the FAST'25 conversation trace through a store (the all-in-one cluster by default)",
		Long: `Starts the all-in-one store (embedded etcd, an HA master journaling to it,
--nodes storage nodes as child processes of --global_segment_size each) unless
--master points at one, then replays the trace: per request the prefill looks
up the longest stored prefix of its 512-token blocks, reads it (every byte
verified) and writes the blocks it lacks. Blocks are --block-size bytes,
scaled down from a real LLaMA3-70B block (160 MiB) so the replay runs in
minutes. Prints a progress bar and a summary table (hit ratio against the
infinite-cache bound, GB moved, GB/s, get latency), and writes per-request
results as Parquet and a PNG plot to --out.

The table goes to stdout; the progress and this process's logs to stderr.
The storage node processes log at --log-level to --out/nodes.log (to
stderr without --out).`,
		Example: `  mooncake bench trace
  mooncake bench trace --max-requests 2000 --block-size 16KiB --out /tmp/replay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bs, err := parseSize(block)
			if err != nil {
				return fmt.Errorf("--block-size: %w", err)
			}
			seg, err := parseSize(segment)
			if err != nil {
				return fmt.Errorf("--global_segment_size: %w", err)
			}
			o.BlockBytes = int(bs)
			if o.Trace, err = trace.Load(path); err != nil {
				return err
			}
			o.Progress = os.Stderr
			if err := o.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			if masterAt == "" {
				cfg := cluster.Config{NoHA: noHA, Nodes: nodes, NodeSegment: seg}
				var logPath string
				if !inProc {
					self, err := os.Executable()
					if err != nil {
						return err
					}
					// The nodes log at this command's level; to a file
					// beside the results, so that no node's line breaks
					// the progress bar or the table.
					cfg.NodeCommand = []string{self, "node", "--local_buffer_size", "8MiB", "--log-level", slogLevel().String()}
					if outDir != "" {
						logs, err := createNodeLog(outDir)
						if err != nil {
							return err
						}
						defer logs.Close()
						cfg.NodeStderr, logPath = logs, logs.Name()
					}
				}
				start := time.Now()
				cl, err := cluster.Start(ctx, cfg)
				if err != nil {
					if logPath != "" {
						return fmt.Errorf("%w (node logs: %s)", err, logPath)
					}
					return err
				}
				defer cl.Close()
				masterAt = cl.MasterURL()
				fmt.Fprintf(out, "cluster: %d node(s) x %s, master %s, ready in %v\n", nodes, te.Size(seg), masterAt,
					time.Since(start).Round(time.Millisecond))
				if logPath != "" {
					fmt.Fprintf(out, "node logs: %s\n", logPath)
				}
			}
			// The replaying client is a prefill instance: it reads and writes
			// the pool and contributes no memory of its own.
			cli, err := client.New(ctx, client.Config{Master: masterAt, SegmentSize: client.NoSegment,
				LocalBufferSize: 256 << 20, EngineConfig: engine.Config{}})
			if err != nil {
				return err
			}
			defer cli.Close()
			res, rerr := trace.Replay(ctx, storeAdapter{cli}, o)
			if res != nil {
				fmt.Fprintln(out)
				if err := res.WriteTable(out); err != nil {
					return err
				}
				if outDir != "" {
					if err := os.MkdirAll(outDir, 0o755); err != nil {
						return err
					}
					pq, png := filepath.Join(outDir, "replay.parquet"), filepath.Join(outDir, "replay.png")
					if err := trace.WriteParquet(pq, res.PerRequest); err != nil {
						return err
					}
					if err := trace.WritePlot(png, res.PerRequest); err != nil {
						return err
					}
					fmt.Fprintf(out, "per-request results: %s\nplot: %s\n", pq, png)
				}
			}
			return rerr
		},
	}
	f := c.Flags()
	f.StringVar(&path, "trace", "", "trace JSONL (zero: the embedded conversation trace)")
	f.StringVar(&block, "block-size", "64KiB", "bytes per 512-token block")
	f.IntVar(&o.MaxRequests, "max-requests", 0, "replay only the first N requests (0: all)")
	f.IntVar(&o.Concurrency, "concurrency", trace.DefaultConcurrency, "requests in flight")
	f.Float64Var(&o.Speedup, "speedup", 0, "replay at trace time / N (0: as fast as possible)")
	f.StringVar(&o.KeyPrefix, "key-prefix", trace.DefaultKeyPrefix, "key prefix (a new one ignores earlier replays)")
	f.StringVar(&masterAt, "master", "", "use this store (host:port or etcd://...) instead of starting one")
	f.IntVar(&nodes, "nodes", 2, "storage nodes of the cluster started")
	f.StringVar(&segment, "global_segment_size", "2GiB", "memory per storage node")
	f.StringVar(&outDir, "out", "replay-out", "directory for replay.parquet and replay.png (empty: none)")
	f.BoolVar(&noHA, "no-ha", false, "one master without the etcd journal")
	f.BoolVar(&inProc, "in-process", false, "run the storage nodes in this process")
	return c
}

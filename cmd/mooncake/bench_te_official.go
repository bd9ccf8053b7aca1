package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/bench/te"
	"github.com/mooncake-go/mooncake/engine"
)

// Official transfer_engine_bench runs as two processes: a target
// (--mode target) that registers a buffer under --local_server_name in the
// metadata service, and an initiator that reads or writes it
// (--segment_id). "mooncake bench te" takes those flags too: --mode target
// serves such a target, and an initiator given --segment_id measures
// against it instead of starting its own.

// officialBenchFlags are official transfer_engine_bench's flags that ours
// has no equivalent of.
var officialBenchFlags = []officialFlag{
	{"auto_discovery", true, "false", "RDMA NIC discovery; the TCP and same-host paths need none"},
	{"backend", false, "classic", "one engine here (no TENT backend to choose)"},
	{"device_name", false, "mlx5_2", "an RDMA device; no RDMA transport here"},
	{"nic_priority_matrix", false, "", "an RDMA NIC priority matrix; no RDMA transport here"},
	{"report_precision", false, "2", "the report is a table (or --json) of GB/s with its own precision"},
	{"report_unit", false, "GB", "the report gives GB/s (10^9 bytes), always"},
}

// benchTEOfficial holds the official flags that map onto ours.
type benchTEOfficial struct {
	mode, metadata, localName, segmentID string
	operation, protocol                  string
	added                                []officialFlag
}

func (b *benchTEOfficial) bindFlags(f *pflag.FlagSet, block, buffer *te.Size, o *te.Options) {
	f.StringVar(&b.mode, "mode", "initiator", "initiator (measure), or target (serve a buffer for another process's initiator, until SIGINT)")
	f.StringVar(&b.metadata, "metadata_server", "P2PHANDSHAKE", "metadata service of --mode target and --segment_id: P2PHANDSHAKE, http://HOST:PORT/metadata, etcd://HOST:PORT (or HOST:PORT)")
	f.StringVar(&b.localName, "local_server_name", "", "this engine's segment name (empty: HOST:PORT of its handshake)")
	f.StringVar(&b.segmentID, "segment_id", "", "measure against this target's segment (another process's --mode target) instead of starting one")
	f.StringVar(&b.operation, "operation", "", "alias of --op, as the official bench")
	f.StringVar(&b.protocol, "protocol", "", "alias of --transport, as the official bench (tcp; others run tcp, with a warning)")
	f.Var(block, "block_size", "alias of --block-size")
	f.IntVar(&o.BatchSize, "batch_size", 64, "alias of --batch-size")
	f.Var(buffer, "buffer_size", "alias of --buffer-size")
	b.added = addOfficialFlags(f, officialBenchFlags, officialLoggingFlags)
}

// apply maps the official flags the command line set onto ours, and says
// whether this run is the initiator of the usual benchmark.
func (b *benchTEOfficial) apply(fs *pflag.FlagSet, transport, op *string) error {
	warnOfficialFlags(fs, b.added, nil)
	if fs.Changed("operation") {
		*op = b.operation
	}
	if fs.Changed("protocol") {
		switch b.protocol {
		case "tcp":
			*transport = "tcp"
		default:
			slog.Warn("bench te: no such transport here, measuring tcp", "protocol", b.protocol)
			*transport = "tcp"
		}
	}
	switch b.mode {
	case "initiator", "target":
		return nil
	}
	return fmt.Errorf("--mode %q: want initiator or target", b.mode)
}

// engineConfig is the engine of either side of a two-process run.
func (b *benchTEOfficial) engineConfig(transport string) engine.Config {
	return engine.Config{Metadata: b.metadata, LocalServerName: b.localName, Transport: transport}
}

// serveTarget is --mode target: an engine with one registered buffer of
// size bytes, named in the metadata service, until ctx ends. Its segment
// name (what initiators pass as --segment_id) goes to out.
func (b *benchTEOfficial) serveTarget(ctx context.Context, out io.Writer, transport string, size int) error {
	e, err := engine.New(ctx, b.engineConfig(transport))
	if err != nil {
		return fmt.Errorf("bench te target: %w", err)
	}
	defer e.Close()
	buf, err := e.AllocateBuffer(ctx, size, "cpu:0")
	if err != nil {
		return fmt.Errorf("bench te target: buffer of %d bytes: %w", size, err)
	}
	defer buf.Free()
	fmt.Fprintf(out, "target ready segment=%s buffer=%#x length=%d\n", e.Name(), buf.Addr(), buf.Len())
	<-ctx.Done()
	return nil
}

// remoteTarget is a te.Launcher for a target started elsewhere: it reads
// the target's first buffer from the metadata service and starts nothing.
type remoteTarget struct {
	cfg     engine.Config
	segment string
}

var _ te.Launcher = remoteTarget{}

// StartTarget implements te.Launcher.
func (r remoteTarget) StartTarget(ctx context.Context, _ te.TargetConfig) (te.TargetInfo, io.Closer, error) {
	e, err := engine.New(ctx, r.cfg)
	if err != nil {
		return te.TargetInfo{}, nil, fmt.Errorf("bench te: engine to look up --segment_id: %w", err)
	}
	defer e.Close()
	seg, err := e.OpenSegment(ctx, r.segment)
	if err != nil {
		return te.TargetInfo{}, nil, fmt.Errorf("bench te: --segment_id %s: %w", r.segment, err)
	}
	bufs, err := e.SegmentBuffers(seg)
	if err != nil {
		return te.TargetInfo{}, nil, err
	}
	if len(bufs) == 0 {
		return te.TargetInfo{}, nil, fmt.Errorf("bench te: --segment_id %s registers no buffer", r.segment)
	}
	return te.TargetInfo{Segment: r.segment, Addr: bufs[0].Addr, Length: bufs[0].Length}, io.NopCloser(nil), nil
}

// StartSink implements te.Launcher: a remote run has no yardstick (it
// would measure this host's loopback, not the path to the target).
func (remoteTarget) StartSink(context.Context, te.SinkConfig) (te.SinkInfo, io.Closer, error) {
	return te.SinkInfo{}, nil, errors.New("bench te: no yardstick against a --segment_id target (use --no-yardstick)")
}

// secondsValue is --duration: a Go duration (5s, 1m) or, as the official
// bench's, a number of seconds.
type secondsValue struct{ d *time.Duration }

func (v secondsValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v secondsValue) Set(s string) error {
	if n, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
		*v.d = time.Duration(n * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want seconds (10) or a duration (10s, 1m)")
	}
	*v.d = d
	return nil
}

func (secondsValue) Type() string { return "duration" }

// runOfficialModes runs the two-process modes, and says whether it did.
func (b *benchTEOfficial) runOfficialModes(cmd *cobra.Command, ctx context.Context, o *te.Options) (bool, error) {
	if b.mode == "target" {
		size := o.BufferSize
		if size == 0 {
			size = 1 << 30 // the official bench's --buffer_size
		}
		return true, b.serveTarget(ctx, cmd.OutOrStdout(), o.Transport, size)
	}
	if !cmd.Flags().Changed("segment_id") {
		return false, nil
	}
	o.Launcher = remoteTarget{cfg: b.engineConfig(o.Transport), segment: b.segmentID}
	o.Metadata = b.metadata
	o.NoYardstick = true
	return false, nil
}

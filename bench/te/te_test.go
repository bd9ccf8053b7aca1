package te_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/bench/te"
	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
)

var quiet = slog.New(slog.DiscardHandler)

// smoke is a tiny in-process benchmark: a check that every part runs and
// the figures hang together, not a measurement.
func smoke(transport string, op engine.Op) te.Options {
	return te.Options{Transport: transport, Op: op, BlockSize: 64 << 10, BatchSize: 8, Threads: 2,
		Duration: 200 * time.Millisecond, Repeat: 1, MemcpySpan: 8 << 20,
		Launcher: te.InProcess{Logger: quiet}, Logger: quiet}
}

func TestRunSmoke(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name      string
		transport string
		op        engine.Op
		yardstick []string // names measured, the first being the lanes-wide one
	}{
		// TCP: the yardstick streams over 4 connections (the default lanes) and 1.
		{"tcp write", "tcp", engine.Write, []string{"loopback-tcp-4conn", "loopback-tcp-1conn"}},
		{"tcp read", "tcp", engine.Read, []string{"loopback-tcp-4conn", "loopback-tcp-1conn"}},
		// Same process, so the shared-memory path copies directly.
		{"shm write", "shm", engine.Write, []string{"memcpy-1thread"}},
		{"shm read", "shm", engine.Read, []string{"memcpy-1thread"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := te.Run(context.Background(), smoke(tc.transport, tc.op))
			require.NoError(t, err)
			assert.Equal(t, tc.transport, res.Transport)
			assert.Equal(t, tc.op.String(), res.Op)
			assert.Equal(t, 64<<10, res.BlockSize)
			assert.Equal(t, 8, res.BatchSize)
			assert.Equal(t, 2, res.Threads)
			assert.Equal(t, 2*8*64<<10, res.BufferSize, "default buffer: threads*batch*block")
			assert.Equal(t, "in-process", res.Target)
			assert.Positive(t, res.Seconds)
			assert.Positive(t, res.Bytes)
			assert.Zero(t, res.Bytes%(64<<10), "whole requests only")
			assert.Equal(t, res.Bytes/(64<<10), res.Requests)
			assert.InDelta(t, float64(res.Bytes)/res.Seconds/1e9, res.GBPerS, 1e-9)
			assert.Positive(t, res.P50us)
			assert.LessOrEqual(t, res.P50us, res.P99us)
			assert.Contains(t, tc.yardstick, res.YardstickName)
			assert.Positive(t, res.YardstickGBPerS)
			assert.InDelta(t, res.GBPerS/res.YardstickGBPerS, res.Ratio, 1e-9)
			require.Len(t, res.Runs, 1+len(tc.yardstick))
			assert.Equal(t, te.Ours, res.Runs[0].Name)
			for i, name := range tc.yardstick {
				assert.Equal(t, name, res.Runs[1+i].Name)
				assert.Positive(t, res.Runs[1+i].Bytes)
			}
			require.NoError(t, res.WriteTable(io.Discard))
		})
	}
}

func TestRunValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*te.Options)
		want string
	}{
		{"unknown transport", func(o *te.Options) { o.Transport = "rdma" }, "Transport"},
		{"unknown op", func(o *te.Options) { o.Op = 7 }, "Op"},
		{"buffer under a block", func(o *te.Options) { o.BufferSize = 4096 }, "BufferSize"},
		{"tiny slices", func(o *te.Options) { o.SliceSize = 100 }, "SliceSize"},
		{"too many lanes", func(o *te.Options) { o.Lanes = 65 }, "Lanes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := smoke("tcp", engine.Write)
			tc.edit(&o)
			_, err := te.Run(context.Background(), o)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// stopsTarget starts an in-process target and stops it after a while, to
// make requests fail.
type stopsTarget struct {
	te.InProcess
	after time.Duration
}

func (l stopsTarget) StartTarget(ctx context.Context, cfg te.TargetConfig) (te.TargetInfo, io.Closer, error) {
	info, c, err := l.InProcess.StartTarget(ctx, cfg)
	if err == nil {
		time.AfterFunc(l.after, func() { c.Close() })
	}
	return info, c, err
}

func TestRunAbortsOnFailedRequest(t *testing.T) {
	o := smoke("tcp", engine.Write)
	o.Duration = 20 * time.Second
	o.Launcher = stopsTarget{InProcess: te.InProcess{Logger: quiet}, after: 300 * time.Millisecond}
	start := time.Now()
	_, err := te.Run(context.Background(), o)
	require.Error(t, err)
	t.Log(err)
	assert.Contains(t, err.Error(), "ended failed")
	assert.Less(t, time.Since(start), 10*time.Second, "a failure ends the run, not the duration")
}

func TestMemcpyYardstick(t *testing.T) {
	src, dst, free, err := te.NewMemcpyBuffers(4 << 20)
	require.NoError(t, err)
	defer free()
	src[12345] = 42
	f, err := te.MemcpyYardstick(context.Background(), te.MemcpyOptions{Chunk: 1 << 20, Src: src, Dst: dst,
		Duration: 50 * time.Millisecond})
	require.NoError(t, err)
	assert.Positive(t, f.GBPerS)
	assert.Equal(t, byte(42), dst[12345], "copies really happen")
}

// The table of spellings is internal/size's; this checks te's wrapper
// reads them the same way (every unit 1024-based).
func TestParseSize(t *testing.T) {
	got, err := te.ParseSize("4MB")
	require.NoError(t, err)
	assert.Equal(t, te.Size(4<<20), got)
	_, err = te.ParseSize("1.3")
	assert.Error(t, err)
	assert.Equal(t, "128KiB", te.Size(128<<10).String())
}

// A write benchmark over TCP with the target in a child process, as
// "mooncake bench te" runs it. (Compiled, not run: it takes seconds.)
func ExampleRun() {
	exe, _ := os.Executable()
	res, err := te.Run(context.Background(), te.Options{
		Transport: "tcp", Op: engine.Write, BlockSize: 1 << 20, Threads: 2, Duration: 5 * time.Second,
		Launcher: te.Exec{Path: exe, Target: []string{"bench", "te", "target"}, Sink: []string{"bench", "te", "tcp-sink"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res.WriteTable(os.Stdout)
}

// TestRunVRAM: with --use_vram both buffers are GPU memory (the driver
// test double's, which faults on any CPU access), device to device through
// the engine's staging path, against the host-memory yardstick.
func TestRunVRAM(t *testing.T) {
	drv, err := devicetest.Driver()
	require.NoError(t, err)
	gpu := drv.Devices() - 1 // the double's second GPU; a GPU host's last
	for _, tc := range []struct {
		transport string
		op        engine.Op
	}{{"tcp", engine.Write}, {"tcp", engine.Read}, {"shm", engine.Write}, {"shm", engine.Read}} {
		t.Run(tc.transport+" "+tc.op.String(), func(t *testing.T) {
			o := smoke(tc.transport, tc.op)
			o.UseVRAM, o.GPUID = true, gpu
			res, err := te.Run(context.Background(), o)
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("cuda:%d", gpu), res.Memory)
			assert.Positive(t, res.Bytes)
			assert.Positive(t, res.YardstickGBPerS)
			require.NoError(t, res.WriteTable(io.Discard))
		})
	}
	o := smoke("tcp", engine.Write)
	o.UseVRAM, o.GPUID = true, drv.Devices()
	_, err = te.Run(context.Background(), o)
	require.ErrorIs(t, err, device.ErrNoDevice)
}

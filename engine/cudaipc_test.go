package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/cudaipc"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// Same-host GPU memory through CUDA IPC: the target is another process (the
// driver, like the test double, refuses to open a process's own handles),
// holding GPU memory of the double; this process reads and writes it from
// its own GPU and host memory. Whether the bytes crossed a socket is told
// by the target's served-bytes metric (TCP) and by the double's count of
// handle opens in this process.

// ipcLen spans several slices, the last one short.
const ipcLen = 1<<20 + 4321

// gpuTarget is a target process with GPU memory.
type gpuTarget struct {
	info targetInfo
	tp   *targetProc
}

// startGPUTarget starts a target, with this process's driver loaded (as
// in a framework's process: the path never loads it itself).
func startGPUTarget(t *testing.T) *gpuTarget {
	driver(t)
	info, tp := startTargetIO(t, "auto", "")
	return &gpuTarget{info: info, tp: tp}
}

// num sends a command whose answer is a number.
func (g *gpuTarget) num(t *testing.T, format string, a ...any) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(g.tp.command(t, fmt.Sprintf(format, a...)), 0, 64)
	require.NoError(t, err)
	return v
}

// gpu registers n bytes on the target's GPU dev, off bytes into their
// allocation.
func (g *gpuTarget) gpu(t *testing.T, dev, n, off int) uint64 {
	return g.num(t, "gpu %d %d %d", dev, n, off)
}

func (g *gpuTarget) sum(t *testing.T, dev int, addr uint64, n int) uint32 {
	return uint32(g.num(t, "gpusum %d %#x %d", dev, addr, n))
}

func (g *gpuTarget) fill(t *testing.T, dev int, addr uint64, n int, seed byte) {
	t.Helper()
	require.Equal(t, "ok", g.tp.command(t, fmt.Sprintf("gpufill %d %#x %d %d", dev, addr, n, seed)))
}

func (g *gpuTarget) served(t *testing.T) uint64 { return g.num(t, "served") }

// ipcOpens counts this process's cuIpcOpenMemHandle calls so far.
func ipcOpens(t *testing.T) int {
	t.Helper()
	n, err := devicetest.Calls("cuIpcOpenMemHandle_v2")
	require.NoError(t, err)
	return n
}

// moveOne runs one checksummed request and returns its status.
func moveOne(t *testing.T, e *engine.Engine, r engine.Request) engine.TransferStatus {
	t.Helper()
	ctx := context.Background()
	b, err := e.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, e.Submit(ctx, b, []engine.Request{r}, engine.WithChecksum()))
	_, err = e.Wait(ctx, b)
	require.NoError(t, err)
	st, err := e.TaskStatus(b, 0)
	require.NoError(t, err)
	require.NoError(t, e.FreeBatch(b))
	return st
}

// roundTrip writes a pattern from local to remote (on the target's GPU
// dev) and reads another back, checking the bytes on both sides and the
// checksums.
func roundTrip(t *testing.T, e *engine.Engine, g *gpuTarget, seg engine.SegmentID, local *mem, dev int, remote uint64, seed byte) {
	t.Helper()
	n := local.n
	want := pattern(n, seed)
	local.write(t, want)
	st := moveOne(t, e, engine.Request{Op: engine.Write, Local: local.addr(), Segment: seg, Remote: remote, Length: uint64(n)})
	require.Equal(t, engine.Completed, st.Status, "write: %v", st.Err)
	require.Equal(t, crc32c.Checksum(want), st.Checksum, "write checksum")
	require.Equal(t, crc32c.Checksum(want), g.sum(t, dev, remote, n), "bytes written to the target's GPU")

	g.fill(t, dev, remote, n, seed+1)
	want = pattern(n, seed+1)
	st = moveOne(t, e, engine.Request{Op: engine.Read, Local: local.addr(), Segment: seg, Remote: remote, Length: uint64(n)})
	require.Equal(t, engine.Completed, st.Status, "read: %v", st.Err)
	require.Equal(t, crc32c.Checksum(want), st.Checksum, "read checksum")
	require.True(t, bytes.Equal(want, local.read(t)), "bytes read from the target's GPU")
}

// TestCudaIPC: with the default paths, GPU and host memory of this process
// move to and from another process's GPU memory through its IPC handles,
// each allocation mapped once, no byte over TCP; a buffer that is part of
// an allocation is reached at its offset.
func TestCudaIPC(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	g := startGPUTarget(t)
	r0 := g.gpu(t, 0, ipcLen, 8192) // a sub-range: the handle is the allocation's
	r1 := g.gpu(t, 1, ipcLen, 0)
	e := newEngine(t, engine.Config{})
	gl := newMem(t, 0, ipcLen)
	hl := newMem(t, -1, ipcLen)
	require.NoError(t, e.RegisterMemory(ctx, gl.addr(), ipcLen, gl.location(), false))
	require.NoError(t, e.RegisterMemory(ctx, hl.addr(), ipcLen, hl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)

	opens := ipcOpens(t)
	for i, c := range []struct {
		local  *mem
		dev    int
		remote uint64
	}{
		{gl, 0, r0}, // device to device
		{hl, 0, r0}, // host to device, on the mapping already open
		{hl, 1, r1}, // another allocation, on another GPU
		{gl, 1, r1}, // device to device across GPUs
	} {
		t.Run(fmt.Sprintf("local%d-remote%d", c.local.dev, c.dev), func(t *testing.T) {
			roundTrip(t, e, g, seg, c.local, c.dev, c.remote, byte(10*i))
		})
	}
	require.Equal(t, 2, ipcOpens(t)-opens, "each allocation mapped once")
	require.Zero(t, g.served(t), "no byte over TCP")
}

// TestCudaIPCOpenFails: an allocation whose handle this process cannot
// open is reached through staging and TCP instead, with the bytes right,
// and its opening is not tried again for every slice.
func TestCudaIPCOpenFails(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	g := startGPUTarget(t)
	r := g.gpu(t, 0, ipcLen, 0)
	e := newEngine(t, engine.Config{})
	gl := newMem(t, 0, ipcLen)
	hl := newMem(t, -1, ipcLen)
	require.NoError(t, e.RegisterMemory(ctx, gl.addr(), ipcLen, gl.location(), false))
	require.NoError(t, e.RegisterMemory(ctx, hl.addr(), ipcLen, hl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)

	opens := ipcOpens(t)
	require.NoError(t, devicetest.Fail("cuIpcOpenMemHandle_v2", 1, 0))
	t.Cleanup(func() { devicetest.Reset() })
	roundTrip(t, e, g, seg, gl, 0, r, 1)
	roundTrip(t, e, g, seg, hl, 0, r, 3)
	require.Equal(t, 1, ipcOpens(t)-opens, "a failed open is not retried")
	// The target counts a request once it answered it: maybe after this
	// side saw the answer.
	eventually(t, func() bool { return g.served(t) >= 4*ipcLen })
}

// TestCudaIPCNotOverTCPOnly: Transport "tcp" never maps a peer's GPU
// memory.
func TestCudaIPCNotOverTCPOnly(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	g := startGPUTarget(t)
	r := g.gpu(t, 0, ipcLen, 0)
	e := newEngine(t, engine.Config{Transport: "tcp"})
	gl := newMem(t, 0, ipcLen)
	require.NoError(t, e.RegisterMemory(ctx, gl.addr(), ipcLen, gl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)

	opens := ipcOpens(t)
	roundTrip(t, e, g, seg, gl, 0, r, 5)
	require.Zero(t, ipcOpens(t)-opens)
	eventually(t, func() bool { return g.served(t) >= 2*ipcLen })
}

// TestCudaIPCReregistered: the target frees its GPU buffer and registers
// another after this process mapped the first: a slice on the freed range
// is refused, not written into the stale mapping; a slice on the new range
// refreshes the view and goes through IPC; the stale mapping is closed.
func TestCudaIPCReregistered(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	g := startGPUTarget(t)
	r := g.gpu(t, 0, ipcLen, 0)
	e := newEngine(t, engine.Config{})
	hl := newMem(t, -1, ipcLen)
	require.NoError(t, e.RegisterMemory(ctx, hl.addr(), ipcLen, hl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)

	opens := ipcOpens(t)
	closes, err := devicetest.Calls("cuIpcCloseMemHandle")
	require.NoError(t, err)
	roundTrip(t, e, g, seg, hl, 0, r, 7)
	require.Equal(t, "ok", g.tp.command(t, fmt.Sprintf("gpufree 0 %#x", r)))
	// This process still maps the freed allocation; the peer's control
	// counter says it unregistered, so the path refreshes and does not
	// write into it: the target refuses the range.
	st := moveOne(t, e, engine.Request{Op: engine.Write, Local: hl.addr(), Segment: seg, Remote: r, Length: ipcLen})
	require.Equal(t, engine.Failed, st.Status, "a write into unregistered GPU memory: %v", st.Err)
	require.ErrorIs(t, st.Err, transport.ErrRejected)
	r2 := g.gpu(t, 0, ipcLen, 0)
	roundTrip(t, e, g, seg, hl, 0, r2, 9)
	require.Equal(t, 2, ipcOpens(t)-opens, "the new allocation mapped")
	now, err := devicetest.Calls("cuIpcCloseMemHandle")
	require.NoError(t, err)
	require.Equal(t, 1, now-closes, "the freed allocation unmapped")
	require.Zero(t, g.served(t), "no byte over TCP")
}

// TestCudaIPCCopyFails: a driver copy that fails on a mapped allocation
// fails its slice with cudaipc.ErrCopy (the refreshed view names the same
// allocation: not retried), and the request with it.
func TestCudaIPCCopyFails(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	g := startGPUTarget(t)
	const n = 64 << 10 // one slice
	r := g.gpu(t, 0, n, 0)
	e := newEngine(t, engine.Config{})
	hl := newMem(t, -1, n)
	require.NoError(t, e.RegisterMemory(ctx, hl.addr(), n, hl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)

	require.NoError(t, devicetest.Fail("cuMemcpy", 1, 0))
	t.Cleanup(func() { devicetest.Reset() })
	st := moveOne(t, e, engine.Request{Op: engine.Write, Local: hl.addr(), Segment: seg, Remote: r, Length: n})
	require.Equal(t, engine.Failed, st.Status)
	require.ErrorIs(t, st.Err, cudaipc.ErrCopy)
	require.Zero(t, g.served(t), "not handed to TCP")
}

// TestCudaIPCCoalescesSlices: a large request to a peer's GPU memory is
// cut into the engine's slices, but the path copies runs of them with one
// driver call each (a driver copy costs the same microseconds whatever its
// length), and the bytes stay right.
func TestCudaIPCCoalescesSlices(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	const n, slice = 16 << 20, 128 << 10
	g := startGPUTarget(t)
	r := g.gpu(t, 0, n, 0)
	e := newEngine(t, engine.Config{SliceSize: slice, DeviceSliceSize: slice})
	gl := newMem(t, 0, n)
	require.NoError(t, e.RegisterMemory(ctx, gl.addr(), n, gl.location(), false))
	seg, err := e.OpenSegment(ctx, g.info.Name)
	require.NoError(t, err)
	want := pattern(n, 77)
	gl.write(t, want)

	before, err := devicetest.Calls("cuMemcpy")
	require.NoError(t, err)
	b, err := e.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, e.Submit(ctx, b, []engine.Request{{Op: engine.Write, Local: gl.addr(), Segment: seg, Remote: r, Length: n}}))
	_, err = e.Wait(ctx, b)
	require.NoError(t, err)
	st, err := e.TaskStatus(b, 0)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.NoError(t, e.FreeBatch(b))
	after, err := devicetest.Calls("cuMemcpy")
	require.NoError(t, err)
	copies := after - before
	t.Logf("%d slices in %d driver copies", n/slice, copies)
	require.Less(t, copies, n/slice/2, "the slices were copied one by one")
	require.Equal(t, crc32c.Checksum(want), g.sum(t, 0, r, n), "bytes written to the target's GPU")
}

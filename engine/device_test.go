package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/stage"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// GPU memory here is the CUDA driver test double's: host memory that the
// CPU cannot touch (any load or store through a device pointer faults, so
// a path that reads device bytes with the CPU kills the test), copied only
// by the double's driver calls.

func driver(t *testing.T) *device.Driver {
	t.Helper()
	d, err := devicetest.Driver()
	require.NoError(t, err)
	return d
}

// gpuMem allocates n bytes on dev, freed with the test.
func gpuMem(t *testing.T, dev, n int) uintptr {
	t.Helper()
	devicetest.RequireGPUs(t, dev+1)
	d := driver(t)
	p, err := d.AllocDevice(dev, uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { d.FreeDevice(dev, p) })
	return p
}

// mem is a test buffer in host or GPU memory.
type mem struct {
	dev  int // -1: host
	host []byte
	gpu  uintptr
	n    int
}

func newMem(t *testing.T, dev, n int) *mem {
	m := &mem{dev: dev, n: n}
	if dev < 0 {
		m.host = anonMem(t, n)
	} else {
		m.gpu = gpuMem(t, dev, n)
	}
	return m
}

func (m *mem) addr() uintptr {
	if m.dev < 0 {
		return addr(m.host)
	}
	return m.gpu
}

func (m *mem) location() string {
	if m.dev < 0 {
		return "cpu:0"
	}
	return fmt.Sprintf("cuda:%d", m.dev)
}

func (m *mem) write(t *testing.T, b []byte) {
	t.Helper()
	if m.dev < 0 {
		copy(m.host, b)
		return
	}
	require.NoError(t, driver(t).Copy(m.dev, m.gpu, addr(b), uint64(len(b))))
}

func (m *mem) read(t *testing.T) []byte {
	t.Helper()
	b := make([]byte, m.n)
	if m.dev < 0 {
		copy(b, m.host)
		return b
	}
	require.NoError(t, driver(t).Copy(m.dev, addr(b), m.gpu, uint64(m.n)))
	return b
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>11)
	}
	return b
}

// TestRegisterDeviceMemory: "cuda:N" must be memory of GPU N; device
// memory registered as "*" or "cpu" is found by asking the driver.
func TestRegisterDeviceMemory(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, engine.Config{Transport: "tcp"})
	g0 := gpuMem(t, 0, 1<<20)
	g1 := gpuMem(t, 1, 1<<20)
	host := anonMem(t, 1<<16)

	require.NoError(t, e.RegisterMemory(ctx, g0, 1<<20, "cuda:0", true))
	require.ErrorIs(t, e.RegisterMemory(ctx, g1, 1<<20, "cuda:7", true), engine.ErrDeviceNotFound)
	err := e.RegisterMemory(ctx, g1, 1<<20, "cuda:0", true)
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, "on cuda:1")
	err = e.RegisterMemory(ctx, addr(host), 1<<16, "cuda:0", true)
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, "not GPU memory")
	require.ErrorIs(t, e.RegisterMemory(ctx, g1+4096, 1<<20, "cuda:1", true), engine.ErrInvalidArgument,
		"runs past its allocation")
	require.ErrorIs(t, e.RegisterMemory(ctx, g1, 1<<20, "cuda:x", true), engine.ErrInvalidArgument)

	require.NoError(t, e.RegisterMemory(ctx, g1, 1<<20, "*", true))
	require.NoError(t, e.RegisterMemory(ctx, addr(host), 1<<16, "cpu:0", true))
	bufs, err := e.SegmentBuffers(engine.LocalSegment)
	require.NoError(t, err)
	locs := map[uint64]string{}
	for _, b := range bufs {
		locs[b.Addr] = b.Location
	}
	require.Equal(t, map[uint64]string{uint64(g0): "cuda:0", uint64(g1): "cuda:1", uint64(addr(host)): ""}, locs,
		"device buffers are published as such")
}

// TestDeviceTransfers moves bytes between every pairing of host and GPU
// memory, over TCP and on the default paths (same host), both ways, in
// requests cut into many slices, checksummed.
func TestDeviceTransfers(t *testing.T) {
	const n = 3<<20 + 12345
	for _, tr := range []string{"tcp", "auto", "shm"} {
		for _, c := range []struct{ local, remote int }{{0, -1}, {-1, 1}, {1, 0}, {0, 0}} {
			name := fmt.Sprintf("%s/local%d-remote%d", tr, c.local, c.remote)
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				target := newEngine(t, engine.Config{Transport: tr})
				remote := newMem(t, c.remote, n)
				require.NoError(t, target.RegisterMemory(ctx, remote.addr(), n, remote.location(), true))
				init := newEngine(t, engine.Config{Transport: tr, DeviceSliceSize: 256 << 10})
				local := newMem(t, c.local, n)
				require.NoError(t, init.RegisterMemory(ctx, local.addr(), n, local.location(), false))
				seg, err := init.OpenSegment(ctx, target.Name())
				require.NoError(t, err)
				move := func(op engine.Op) engine.TransferStatus {
					b, err := init.AllocateBatch(1)
					require.NoError(t, err)
					require.NoError(t, init.Submit(ctx, b, []engine.Request{{Op: op, Local: local.addr(), Segment: seg,
						Remote: uint64(remote.addr()), Length: n}}, engine.WithChecksum()))
					_, err = init.Wait(ctx, b)
					require.NoError(t, err)
					st, err := init.TaskStatus(b, 0)
					require.NoError(t, err)
					require.NoError(t, init.FreeBatch(b))
					return st
				}

				want := pattern(n, 1)
				local.write(t, want)
				st := move(engine.Write)
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
				require.Equal(t, crc32c.Checksum(want), st.Checksum)
				require.True(t, bytes.Equal(want, remote.read(t)), "written bytes")

				want = pattern(n, 2)
				remote.write(t, want)
				st = move(engine.Read)
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
				require.Equal(t, crc32c.Checksum(want), st.Checksum)
				require.True(t, bytes.Equal(want, local.read(t)), "read bytes")
			})
		}
	}
}

// TestDeviceLocalSegment: copies within this engine between host and GPU
// memory go through the driver, checksummed from a host copy.
func TestDeviceLocalSegment(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, engine.Config{})
	const n = 1 << 20
	g := newMem(t, 0, n)
	h := newMem(t, -1, n)
	require.NoError(t, e.RegisterMemory(ctx, g.addr(), n, "cuda:0", false))
	require.NoError(t, e.RegisterMemory(ctx, h.addr(), n, "cpu:0", false))
	want := pattern(n, 3)
	g.write(t, want)
	for _, r := range []engine.Request{
		{Op: engine.Write, Local: g.addr(), Segment: engine.LocalSegment, Remote: uint64(h.addr()), Length: n},
		{Op: engine.Read, Local: g.addr(), Segment: engine.LocalSegment, Remote: uint64(h.addr()), Length: n},
	} {
		b, err := e.AllocateBatch(1)
		require.NoError(t, err)
		require.NoError(t, e.Submit(ctx, b, []engine.Request{r}, engine.WithChecksum()))
		_, err = e.Wait(ctx, b)
		require.NoError(t, err)
		st, err := e.TaskStatus(b, 0)
		require.NoError(t, err)
		require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
		require.Equal(t, crc32c.Checksum(want), st.Checksum)
		require.True(t, bytes.Equal(want, h.read(t)))
		require.True(t, bytes.Equal(want, g.read(t)))
		require.NoError(t, e.FreeBatch(b))
	}
}

// TestDeviceCopyFails: a driver call that fails mid-transfer fails the
// task, on the initiator's side (staging) and on the target's (serving):
// an error status, nothing reported complete, and the engines go on.
func TestDeviceCopyFails(t *testing.T) {
	devicetest.RequireDouble(t)
	ctx := context.Background()
	const n = 2 << 20
	for _, c := range []struct {
		name          string
		local, remote int
		op            engine.Op
		want          error
	}{
		{"staging a write", 0, -1, engine.Write, stage.ErrDevice},
		{"unstaging a read", 0, -1, engine.Read, stage.ErrDevice},
		{"serving a read", -1, 0, engine.Read, transport.ErrRejected},
		{"serving a write", -1, 0, engine.Write, transport.ErrRejected},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := newEngine(t, engine.Config{Transport: "tcp"})
			remote := newMem(t, c.remote, n)
			require.NoError(t, target.RegisterMemory(ctx, remote.addr(), n, remote.location(), true))
			init := newEngine(t, engine.Config{Transport: "tcp", DeviceSliceSize: 128 << 10})
			local := newMem(t, c.local, n)
			require.NoError(t, init.RegisterMemory(ctx, local.addr(), n, local.location(), false))
			seg, err := init.OpenSegment(ctx, target.Name())
			require.NoError(t, err)
			req := []engine.Request{{Op: c.op, Local: local.addr(), Segment: seg, Remote: uint64(remote.addr()), Length: n}}

			require.NoError(t, devicetest.Fail("cuMemcpy", 3, 0))
			st := transfer(t, init, req)
			require.Equal(t, engine.Failed, st.Status)
			require.ErrorIs(t, st.Err, c.want)
			require.Less(t, st.Transferred, uint64(n), "a failed slice is not counted")

			st = transfer(t, init, req) // nothing armed: the engines go on
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
		})
	}
	require.NoError(t, devicetest.Reset())
}

// TestRegisterWithoutDriver: on a host without the CUDA driver, device
// memory cannot be registered, with an error that says why (in a child
// process: the driver is loaded once per process).
func TestRegisterWithoutDriver(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MC_TEST_NODRIVER=1", "MC_CUDA_DRIVER=/nonexistent/libcuda.so.1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "CUDA driver not available")
}

// registerWithoutDriver is the child of TestRegisterWithoutDriver.
func registerWithoutDriver() int {
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1"})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer e.Close()
	b := make([]byte, 4096)
	err = e.RegisterMemory(context.Background(), engine.AddrOf(b), 4096, "cuda:0", true)
	if !errors.Is(err, engine.ErrDeviceNotFound) || !errors.Is(err, device.ErrNoDriver) {
		fmt.Println("want ErrDeviceNotFound and ErrNoDriver, got:", err)
		return 1
	}
	if err := e.RegisterMemory(context.Background(), engine.AddrOf(b), 4096, "*", true); err != nil {
		fmt.Println("host memory without a driver:", err)
		return 1
	}
	fmt.Println(strings.TrimSpace(err.Error()))
	return 0
}

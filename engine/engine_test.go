package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// newEngine starts an engine on loopback and closes it with the test.
func newEngine(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	e, err := engine.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// anonMem maps n bytes outside the Go heap, as C or Python callers pass.
func anonMem(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return engine.AddrOf(b) }

func transfer(t *testing.T, e *engine.Engine, reqs []engine.Request) engine.TransferStatus {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	require.NoError(t, err)
	require.NoError(t, e.Submit(context.Background(), b, reqs))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.Wait(ctx, b)
	require.NoError(t, err)
	require.NoError(t, e.FreeBatch(b))
	return st
}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport string
		shared    bool // target memory from AllocateBuffer (memfd)
	}{
		{"tcp raw memory", "tcp", false},
		{"tcp memfd buffer", "tcp", true},
		{"auto same process", "auto", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := newEngine(t, engine.Config{Transport: tc.transport})
			init := newEngine(t, engine.Config{Transport: tc.transport, SliceSize: 64 << 10})
			const n = 3<<20 + 12345
			var dst []byte
			if tc.shared {
				buf, err := target.AllocateBuffer(context.Background(), n, "cpu:0")
				require.NoError(t, err)
				defer buf.Free()
				dst = buf.Bytes()
			} else {
				dst = anonMem(t, n)
				require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), n, "cpu:0", true))
			}
			src := anonMem(t, 2*n)
			rand.Read(src[:n])
			require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 2*n, "", true))

			seg, err := init.OpenSegment(context.Background(), target.Name())
			require.NoError(t, err)
			st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: n}})
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			require.Equal(t, uint64(n), st.Transferred)
			require.True(t, bytes.Equal(src[:n], dst))

			st = transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(src[n:]), Segment: seg, Remote: uint64(addr(dst)), Length: n}})
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			require.True(t, bytes.Equal(src[:n], src[n:]))
		})
	}
}

func TestRemoteRangeOutsideRegistrationRejected(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	init := newEngine(t, engine.Config{Transport: "tcp"})
	dst := anonMem(t, 1<<20)
	guard := anonMem(t, 4096)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), 1<<20-4096, "", true))
	private := anonMem(t, 4096)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(private), 4096, "", false))
	src := anonMem(t, 1<<20)
	for i := range src {
		src[i] = 0xAB
	}
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 1<<20, "", true))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		remote uint64
		length uint64
	}{
		{"crosses the end of the region", uint64(addr(dst)) + 1<<20 - 8192, 8192},
		{"wholly unregistered", uint64(addr(guard)), 16},
		{"not remote-accessible", uint64(addr(private)), 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, op := range []engine.Op{engine.Write, engine.Read} {
				st := transfer(t, init, []engine.Request{{Op: op, Local: addr(src), Segment: seg, Remote: tc.remote, Length: tc.length}})
				require.Equal(t, engine.Failed, st.Status)
				require.ErrorIs(t, st.Err, transport.ErrRejected)
			}
		})
	}
	// Nothing beyond the registered range was touched, and the lanes still
	// work after the rejections.
	require.Equal(t, make([]byte, 8192), dst[1<<20-8192:])
	require.Equal(t, make([]byte, 16), private[:16])
	st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: 4096}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
}

// TestNewFailsCleanly: an engine that cannot start (its handshake port is
// taken) returns an error, without panicking, and stops what it started
// (TestMain's leak check sees its data listener's goroutines otherwise).
func TestNewFailsCleanly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", RPCPort: ln.Addr().(*net.TCPAddr).Port})
	require.Nil(t, e)
	var ee *engine.Error
	require.ErrorAs(t, err, &ee)
	require.Equal(t, engine.CodeSocket, ee.Code)
}

func TestBatchAPIErrors(t *testing.T) {
	e := newEngine(t, engine.Config{Transport: "tcp"})
	mem := anonMem(t, 8192)
	require.NoError(t, e.RegisterMemory(context.Background(), addr(mem), 4096, "", true))

	for _, tc := range []struct {
		name string
		call func() error
		code engine.Code
	}{
		{"zero-length registration", func() error { return e.RegisterMemory(context.Background(), addr(mem[4096:]), 0, "", true) }, engine.CodeInvalidArgument},
		{"overlapping registration", func() error { return e.RegisterMemory(context.Background(), addr(mem[100:]), 200, "", true) }, engine.CodeAddressOverlapped},
		{"unregister unknown", func() error { return e.UnregisterMemory(context.Background(), addr(mem[4096:])) }, engine.CodeAddressNotRegistered},
		{"zero batch", func() error { _, err := e.AllocateBatch(0); return err }, engine.CodeInvalidArgument},
		{"free unknown batch", func() error { return e.FreeBatch(12345) }, engine.CodeInvalidArgument},
		{"submit to unknown batch", func() error { return e.Submit(context.Background(), 777, nil) }, engine.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.code, engine.CodeOf(tc.call()))
		})
	}

	b, err := e.AllocateBatch(1)
	require.NoError(t, err)
	local := engine.Request{Op: engine.Write, Local: addr(mem), Segment: engine.LocalSegment, Remote: uint64(addr(mem)) + 2048, Length: 1024}
	bad := []struct {
		name string
		req  engine.Request
		code engine.Code
	}{
		{"unregistered local memory", engine.Request{Op: engine.Write, Local: addr(mem[4096:]), Segment: engine.LocalSegment, Remote: uint64(addr(mem)), Length: 8}, engine.CodeAddressNotRegistered},
		{"unknown segment", engine.Request{Op: engine.Write, Local: addr(mem), Segment: 99, Remote: 1, Length: 8}, engine.CodeInvalidArgument},
		{"zero length", engine.Request{Op: engine.Write, Local: addr(mem), Segment: engine.LocalSegment, Remote: uint64(addr(mem)), Length: 0}, engine.CodeInvalidArgument},
		{"bad opcode", engine.Request{Op: 7, Local: addr(mem), Segment: engine.LocalSegment, Remote: uint64(addr(mem)), Length: 8}, engine.CodeInvalidArgument},
	}
	for _, tc := range bad {
		require.Equal(t, tc.code, engine.CodeOf(e.Submit(context.Background(), b, []engine.Request{tc.req})), tc.name)
	}
	require.NoError(t, e.Submit(context.Background(), b, []engine.Request{local}))
	require.Equal(t, engine.CodeTooManyRequests, engine.CodeOf(e.Submit(context.Background(), b, []engine.Request{local})))
	st, err := e.Wait(context.Background(), b)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, st.Status)
	_, err = e.TaskStatus(b, 1)
	require.Equal(t, engine.CodeInvalidArgument, engine.CodeOf(err))
	require.NoError(t, e.FreeBatch(b))
	require.NoError(t, e.Close())
	require.True(t, errors.Is(e.RegisterMemory(context.Background(), addr(mem[4096:]), 10, "", true), engine.ErrClosed))
}

// TestShallowSubmit runs small batches, which the submitting goroutine
// sends itself over TCP, settled each way a caller can: waiting, waiting
// with a context that may end, polling, freeing too early.
func TestShallowSubmit(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	init := newEngine(t, engine.Config{Transport: "tcp", SliceSize: 256 << 10})
	const n = 1 << 20
	dst := anonMem(t, n)
	rand.Read(dst)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), n, "", true))
	src := anonMem(t, n)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), n, "", true))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		settle func(t *testing.T, b engine.BatchID) (st engine.TransferStatus, freed bool)
	}{
		{"wait", func(t *testing.T, b engine.BatchID) (engine.TransferStatus, bool) {
			st, err := init.Wait(context.Background(), b)
			require.NoError(t, err)
			return st, false
		}},
		{"wait with a live context", func(t *testing.T, b engine.BatchID) (engine.TransferStatus, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, err := init.Wait(ctx, b)
			require.NoError(t, err)
			return st, false
		}},
		{"wait with an ended context, then wait", func(t *testing.T, b engine.BatchID) (engine.TransferStatus, bool) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := init.Wait(ctx, b); err != nil {
				require.ErrorIs(t, err, context.Canceled)
			}
			st, err := init.Wait(context.Background(), b)
			require.NoError(t, err)
			return st, false
		}},
		{"poll", func(t *testing.T, b engine.BatchID) (engine.TransferStatus, bool) {
			deadline := time.Now().Add(20 * time.Second)
			for {
				st, err := init.BatchStatus(b)
				require.NoError(t, err)
				if st.Status.Done() || time.Now().After(deadline) {
					return st, false
				}
				time.Sleep(100 * time.Microsecond) // polling is the API under test
			}
		}},
		{"free too early, then wait", func(t *testing.T, b engine.BatchID) (engine.TransferStatus, bool) {
			if err := init.FreeBatch(b); err == nil {
				// Done already: it took the queued path.
				return engine.TransferStatus{Status: engine.Completed}, true
			} else {
				require.ErrorIs(t, err, engine.ErrBatchBusy)
			}
			st, err := init.Wait(context.Background(), b)
			require.NoError(t, err)
			return st, false
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 20 {
				clear(src)
				b, err := init.AllocateBatch(2)
				require.NoError(t, err)
				// Two requests, four slices: one inline group.
				require.NoError(t, init.Submit(context.Background(), b, []engine.Request{
					{Op: engine.Read, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: n / 2},
					{Op: engine.Read, Local: addr(src[n/2:]), Segment: seg, Remote: uint64(addr(dst[n/2:])), Length: n / 2},
				}))
				st, freed := tc.settle(t, b)
				require.Equal(t, engine.Completed, st.Status, "round %d: %v", i, st.Err)
				if !freed {
					require.NoError(t, init.FreeBatch(b))
				}
				require.True(t, bytes.Equal(dst, src), "round %d", i)
			}
		})
	}
}

// TestWithChecksum checks that WithChecksum reports the CRC-32C of exactly
// the bytes each task moved, whichever path moved them and however its
// slices finished.
func TestWithChecksum(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport string
		local     bool // the local segment: a plain copy
	}{
		{"tcp, slices over lanes", "tcp", false},
		{"same host", "auto", false},
		{"local segment", "auto", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := newEngine(t, engine.Config{Transport: tc.transport})
			init := newEngine(t, engine.Config{Transport: tc.transport, SliceSize: 64 << 10})
			const n = 1<<20 + 777
			remote, err := target.AllocateBuffer(context.Background(), 2*n, "cpu:0")
			require.NoError(t, err)
			defer remote.Free()
			rand.Read(remote.Bytes())
			local := anonMem(t, 2*n)
			require.NoError(t, init.RegisterMemory(context.Background(), addr(local), 2*n, "", true))
			seg := engine.LocalSegment
			if tc.local {
				require.NoError(t, init.RegisterMemory(context.Background(), remote.Addr(), 2*n, "", true))
			} else {
				seg, err = init.OpenSegment(context.Background(), target.Name())
				require.NoError(t, err)
			}
			// A lone request (sent inline over TCP), then a batch of reads and
			// a write of odd sizes and offsets, on local ranges apart (tasks of
			// a batch run at once).
			batches := [][]engine.Request{
				{{Op: engine.Read, Local: addr(local), Segment: seg, Remote: uint64(remote.Addr()), Length: n}},
				{
					{Op: engine.Read, Local: addr(local), Segment: seg, Remote: uint64(remote.Addr()) + 5, Length: 300 << 10},
					{Op: engine.Read, Local: addr(local[n:]), Segment: seg, Remote: uint64(remote.Addr()) + n, Length: 1},
					{Op: engine.Write, Local: addr(local[n+9:]), Segment: seg, Remote: uint64(remote.Addr()) + n + 1, Length: 200 << 10},
				},
			}
			for _, reqs := range batches {
				b, err := init.AllocateBatch(len(reqs))
				require.NoError(t, err)
				require.NoError(t, init.Submit(context.Background(), b, reqs, engine.WithChecksum()))
				_, err = init.Wait(context.Background(), b)
				require.NoError(t, err)
				for i, r := range reqs {
					st, err := init.TaskStatus(b, i)
					require.NoError(t, err)
					require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
					want := crc32c.Checksum(local[r.Local-addr(local):][:r.Length])
					require.Equal(t, want, st.Checksum, "task %d", i)
				}
				require.NoError(t, init.FreeBatch(b))
			}
		})
	}
}

// TestFreeAfterTasksFinal: once every task of a batch reads as finished,
// the batch can be freed at once (polling callers such as NIXL's plugin
// free it right after their last TaskStatus).
func TestFreeAfterTasksFinal(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	e := newEngine(t, engine.Config{Transport: "tcp"})
	remote, err := target.AllocateBuffer(context.Background(), 1<<20, "cpu:0")
	require.NoError(t, err)
	defer remote.Free()
	mem := anonMem(t, 1<<20)
	require.NoError(t, e.RegisterMemory(context.Background(), addr(mem), 1<<20, "", true))
	seg, err := e.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	for range 500 {
		b, err := e.AllocateBatch(2)
		require.NoError(t, err)
		require.NoError(t, e.Submit(context.Background(), b, []engine.Request{
			{Op: engine.Write, Local: addr(mem), Segment: seg, Remote: uint64(remote.Addr()), Length: 4096},
			{Op: engine.Read, Local: addr(mem[8192:]), Segment: seg, Remote: uint64(remote.Addr()) + 8192, Length: 4096},
		}))
		for i := range 2 {
			for {
				st, err := e.TaskStatus(b, i)
				require.NoError(t, err)
				if st.Status.Done() {
					break
				}
			}
		}
		require.NoError(t, e.FreeBatch(b))
	}
}

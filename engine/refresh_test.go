package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// counter sums the series of metric name in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

func write(t *testing.T, e *engine.Engine, seg engine.SegmentID, src []byte, remote uint64) engine.TransferStatus {
	t.Helper()
	return transfer(t, e, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: remote, Length: uint64(len(src))}})
}

// TestViewFollowsRegistrations: memory a peer registers after it was
// opened is reachable through the same-host path - plain memory and memfd
// buffers alike - because the view is refreshed on the miss instead of
// refusing the range (NIXL's backend test registers more memory after
// loadRemoteConnInfo).
func TestViewFollowsRegistrations(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport string
		metadata  string // "": P2PHANDSHAKE
	}{
		{"auto", "auto", ""},
		{"shm", "shm", ""},
		// The descriptor opened from the store; refreshes ask the peer.
		{"auto with a metadata store", "auto", "memory://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			tcfg := engine.Config{}
			icfg := engine.Config{Transport: tc.transport, Registerer: reg}
			if tc.metadata != "" {
				tcfg.Metadata, tcfg.LocalServerName = tc.metadata+t.Name(), "target"
				icfg.Metadata, icfg.LocalServerName = tc.metadata+t.Name(), "init"
			}
			target := newEngine(t, tcfg)
			init := newEngine(t, icfg)
			first := anonMem(t, 4096)
			require.NoError(t, target.RegisterMemory(context.Background(), addr(first), 4096, "", true))
			const n = 1 << 20
			src := anonMem(t, 2*n)
			require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 2*n, "", true))
			seg, err := init.OpenSegment(context.Background(), target.Name())
			require.NoError(t, err)

			plain := anonMem(t, n)
			require.NoError(t, target.RegisterMemory(context.Background(), addr(plain), n, "", true))
			buf, err := target.AllocateBuffer(context.Background(), n, "")
			require.NoError(t, err)
			defer buf.Free()
			for _, dst := range [][]byte{plain, buf.Bytes()} {
				rand.Read(src[:n])
				st := write(t, init, seg, src[:n], uint64(addr(dst)))
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
				require.True(t, bytes.Equal(src[:n], dst))
				st = transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(src[n:]), Segment: seg, Remote: uint64(addr(dst)), Length: n}})
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
				require.True(t, bytes.Equal(src[:n], src[n:]))
			}
			require.Equal(t, 4.0, counter(t, reg, "mooncake_te_requests_total",
				map[string]string{"transport": "shm", "status": "completed"}), "all through shared memory")
			require.GreaterOrEqual(t, counter(t, reg, "mooncake_te_segment_refreshes_total", nil), 1.0)
			bufs, err := init.SegmentBuffers(seg)
			require.NoError(t, err)
			require.Len(t, bufs, 3, "the segment's buffers follow the refresh")
		})
	}
}

// TestViewAfterUnregister: once the peer unregisters memory and registers
// other memory (a new memfd buffer perhaps at the old address behind the
// old descriptor number), the initiator's view is refreshed, not given up:
// the new memory is reached through shared memory, the bytes land in the
// new buffer rather than in a stale mapping of the old one, and the
// unregistered range is refused without being touched.
func TestViewAfterUnregister(t *testing.T) {
	for _, transport := range []string{"auto", "shm"} {
		t.Run(transport, func(t *testing.T) {
			target := newEngine(t, engine.Config{})
			reg := prometheus.NewRegistry()
			init := newEngine(t, engine.Config{Transport: transport, Registerer: reg})
			const n = 1 << 20
			src := anonMem(t, n)
			require.NoError(t, init.RegisterMemory(context.Background(), addr(src), n, "", true))
			old := anonMem(t, n)
			require.NoError(t, target.RegisterMemory(context.Background(), addr(old), n, "", true))
			buf1, err := target.AllocateBuffer(context.Background(), n, "")
			require.NoError(t, err)
			seg, err := init.OpenSegment(context.Background(), target.Name())
			require.NoError(t, err)
			for _, dst := range []uintptr{addr(old), buf1.Addr()} {
				st := write(t, init, seg, src, uint64(dst))
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			}

			require.NoError(t, target.UnregisterMemory(context.Background(), addr(old)))
			buf1Addr := buf1.Addr()
			require.NoError(t, buf1.Free())
			buf2, err := target.AllocateBuffer(context.Background(), n, "")
			require.NoError(t, err)
			defer buf2.Free()
			t.Logf("new buffer at the old address: %v", buf2.Addr() == buf1Addr)
			fresh := anonMem(t, n)
			require.NoError(t, target.RegisterMemory(context.Background(), addr(fresh), n, "", true))

			// old is still mapped here: a write through the stale view
			// would land in it.
			clear(old)
			rand.Read(src)
			st := write(t, init, seg, src, uint64(addr(old)))
			require.Equal(t, engine.Failed, st.Status)
			require.Equal(t, make([]byte, n), old, "unregistered memory was written")
			if buf2.Addr() != buf1Addr {
				st = write(t, init, seg, src, uint64(buf1Addr))
				require.Equal(t, engine.Failed, st.Status)
			}
			for _, dst := range [][]byte{buf2.Bytes(), fresh} {
				rand.Read(src)
				st := write(t, init, seg, src, uint64(addr(dst)))
				require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
				require.True(t, bytes.Equal(src, dst), "bytes not in the peer's new memory")
			}
			require.Equal(t, 4.0, counter(t, reg, "mooncake_te_requests_total",
				map[string]string{"transport": "shm", "status": "completed"}), "all through shared memory")
		})
	}
}

// TestViewRefreshCoalesced: a batch whose requests miss the view - some
// into memory registered after the open, many into memory never
// registered - costs a couple of descriptor requests, not one per miss;
// the first kind completes and the second fails.
func TestViewRefreshCoalesced(t *testing.T) {
	target := newEngine(t, engine.Config{})
	reg := prometheus.NewRegistry()
	init := newEngine(t, engine.Config{Registerer: reg})
	first := anonMem(t, 4096)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(first), 4096, "", true))
	src := anonMem(t, 4096)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 4096, "", true))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	const k = 64
	later := anonMem(t, k*4096)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(later), k*4096, "", true))
	never := anonMem(t, k*4096)

	reqs := make([]engine.Request, 2*k)
	for i := range k {
		reqs[2*i] = engine.Request{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(later)) + uint64(i)*4096, Length: 4096}
		reqs[2*i+1] = engine.Request{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(never)) + uint64(i)*4096, Length: 4096}
	}
	b, err := init.AllocateBatch(len(reqs))
	require.NoError(t, err)
	require.NoError(t, init.Submit(context.Background(), b, reqs))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = init.Wait(ctx, b)
	require.NoError(t, err)
	for i := range reqs {
		ts, err := init.TaskStatus(b, i)
		require.NoError(t, err)
		if i%2 == 0 {
			require.Equal(t, engine.Completed, ts.Status, "task %d: %v", i, ts.Err)
		} else {
			require.Equal(t, engine.Failed, ts.Status, "task %d", i)
			require.ErrorContains(t, ts.Err, "not inside the registered memory")
		}
	}
	require.NoError(t, init.FreeBatch(b))
	refreshes := counter(t, reg, "mooncake_te_segment_refreshes_total", nil)
	t.Logf("%v refreshes for %d misses", refreshes, 2*k)
	require.GreaterOrEqual(t, refreshes, 1.0)
	require.LessOrEqual(t, refreshes, 6.0, "refreshes are coalesced")
}

// TestSameHostViewFollowsPeer is the same story across processes, as
// frameworks meet it: the target registers memfd buffers and plain memory
// after the open (reached by mapping and by process_vm_writev), frees
// them and allocates anew. The target checks its own bytes; the
// initiator's mappings of freed buffers are gone.
func TestSameHostViewFollowsPeer(t *testing.T) {
	info, tp := startTargetIO(t, "auto", "")
	init := newEngine(t, engine.Config{Transport: "shm"})
	const n = 1 << 20
	src := anonMem(t, n)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), n, "", true))
	mapped := memfdMappings(t)
	seg, err := init.OpenSegment(context.Background(), info.Name)
	require.NoError(t, err)
	target := func(cmd string, args ...any) uint64 {
		v, err := strconv.ParseUint(tp.command(t, fmt.Sprintf(cmd, args...)), 0, 64)
		require.NoError(t, err)
		return v
	}
	sum := func(remote uint64) uint64 { return target("sum %#x %d", remote, n) }
	landed := func(remote uint64) {
		t.Helper()
		rand.Read(src)
		st := write(t, init, seg, src, remote)
		require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
		require.Equal(t, uint64(crc32c.Checksum(src)), sum(remote), "bytes not in the target's memory at %#x", remote)
	}
	refused := func(remote uint64) {
		t.Helper()
		rand.Read(src)
		st := write(t, init, seg, src, remote)
		require.Equal(t, engine.Failed, st.Status)
	}

	landed(info.Addr)
	memfd := target("alloc %d", n)
	plain := target("register %d", n)
	landed(memfd)
	landed(plain)

	// Both go and a new buffer comes, before the initiator looks again.
	require.Equal(t, "ok", tp.command(t, fmt.Sprintf("free %#x", memfd)))
	require.Equal(t, "ok", tp.command(t, fmt.Sprintf("free %#x", plain)))
	memfd2 := target("alloc %d", n)
	t.Logf("new buffer at the old address: %v", memfd2 == memfd)
	landed(memfd2)
	before := sum(plain) // still mapped in the target, no longer registered
	refused(plain)
	require.Equal(t, before, sum(plain), "unregistered memory was written")
	if memfd2 != memfd {
		refused(memfd)
	}
	require.Equal(t, mapped+2, memfdMappings(t), "mappings of the target's live buffers (the first and the last)")
}

// memfdMappings counts this process's mappings of engine buffers.
func memfdMappings(t *testing.T) int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Count(string(maps), "/memfd:mooncake-buffer")
}

// TestCloseSegmentDuringRefresh: closing a segment while its view is being
// refreshed - the peer allocating and freeing buffers all the while, so
// refreshes keep finding buffers gone between the descriptor and the
// mapping - neither races with the refresh (run with -race) nor touches
// the peer's unmapped control page; every slice settles.
func TestCloseSegmentDuringRefresh(t *testing.T) {
	target := newEngine(t, engine.Config{})
	reg := prometheus.NewRegistry()
	init := newEngine(t, engine.Config{Transport: "shm", Registerer: reg})
	const n = 4096
	src := anonMem(t, n)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), n, "", true))
	never := anonMem(t, 16*n) // never registered: every write misses the view

	// The peer churns buffers until the test ends, except while the
	// initiator opens the segment (Open wants the buffers it is told of).
	var opening sync.RWMutex
	stop := make(chan struct{})
	churned := make(chan error, 4)
	for i := range cap(churned) {
		go func() {
			// Each buffer lives until the next is allocated, so the
			// descriptor always lists some, each soon gone.
			var live *engine.Buffer
			for {
				select {
				case <-stop:
					var err error
					if live != nil {
						err = live.Free()
					}
					churned <- err
					return
				default:
				}
				opening.RLock()
				b, err := target.AllocateBuffer(context.Background(), (1+i)*n, "")
				if err == nil && live != nil {
					err = live.Free()
				}
				live = b
				opening.RUnlock()
				if err != nil {
					churned <- err
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		for range cap(churned) {
			require.NoError(t, <-churned)
		}
	}()

	for range 40 {
		opening.Lock()
		seg, err := init.OpenSegment(context.Background(), target.Name())
		opening.Unlock()
		require.NoError(t, err)
		reqs := make([]engine.Request, 16)
		for i := range reqs {
			reqs[i] = engine.Request{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(never)) + uint64(i)*n, Length: n}
		}
		b, err := init.AllocateBatch(len(reqs))
		require.NoError(t, err)
		before := counter(t, reg, "mooncake_te_segment_refreshes_total", nil)
		require.NoError(t, init.Submit(context.Background(), b, reqs))
		// Close once a second refresh began (the first one's slices came
		// back to wait: it found a buffer gone or ran while they missed),
		// or once the batch settled; polled, as nothing signals either.
		for counter(t, reg, "mooncake_te_segment_refreshes_total", nil) < before+2 {
			st, err := init.BatchStatus(b)
			require.NoError(t, err)
			if st.Status.Done() {
				break
			}
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, init.CloseSegment(seg))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st, err := init.Wait(ctx, b)
		cancel()
		require.NoError(t, err)
		require.Equal(t, engine.Failed, st.Status, "writes outside the peer's memory, segment closed")
		require.NoError(t, init.FreeBatch(b))
	}
}

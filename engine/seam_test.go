package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/transporttest"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/internal/nettest"
)

// The tests here drive the engine through an in-memory data path that
// holds every slice until the test settles it, in orders and with outcomes
// that no socket produces on demand. The target is a real engine in this
// process; the fake path moves its bytes with memmove.

const seamSlice = 4096

type seam struct {
	fake          *transporttest.Fake
	init, target  *engine.Engine
	seg           engine.SegmentID
	local, remote []byte
}

func newSeam(t *testing.T, fake *transporttest.Fake) *seam {
	t.Helper()
	sm := &seam{fake: fake}
	sm.target = newEngine(t, engine.Config{Transport: "tcp"})
	sm.remote = anonMem(t, 1<<20)
	for i := range sm.remote {
		sm.remote[i] = byte(i*7 + 1)
	}
	require.NoError(t, sm.target.RegisterMemory(context.Background(), addr(sm.remote), uint64(len(sm.remote)), "", true))
	sm.init = newEngine(t, engine.Config{Transport: "tcp", SliceSize: seamSlice,
		Transports: []transport.Transport{fake}})
	sm.local = anonMem(t, 1<<20)
	require.NoError(t, sm.init.RegisterMemory(context.Background(), addr(sm.local), uint64(len(sm.local)), "", false))
	var err error
	sm.seg, err = sm.init.OpenSegment(context.Background(), sm.target.Name())
	require.NoError(t, err)
	return sm
}

// read submits one READ of n bytes at off (both sides) as a new batch.
func (sm *seam) read(t *testing.T, off, n int, opts ...engine.SubmitOption) engine.BatchID {
	t.Helper()
	b, err := sm.init.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, sm.init.Submit(context.Background(), b, []engine.Request{{Op: engine.Read,
		Local: addr(sm.local[off:]), Segment: sm.seg, Remote: uint64(addr(sm.remote[off:])), Length: uint64(n)}}, opts...))
	return b
}

func (sm *seam) take(t *testing.T, n int) []*transport.Slice {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sl, err := sm.fake.Take(ctx, n)
	require.NoError(t, err)
	return sl
}

func (sm *seam) wait(t *testing.T, b engine.BatchID) engine.TransferStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := sm.init.Wait(ctx, b)
	require.NoError(t, err)
	return st
}

// TestSeamOpensWithTheNextPath: the engine offers the peer to the fake
// with its descriptor, its data addresses, a way to ask for the live
// descriptor, and the TCP peer as the next path; slices go to the fake.
func TestSeamOpensWithTheNextPath(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	opened := sm.fake.Opened()
	require.Len(t, opened, 1)
	info := opened[0]
	require.Equal(t, sm.target.Name(), info.Name)
	require.Equal(t, sm.target.Name(), info.Desc.Name)
	require.Len(t, info.Addrs, 1)
	require.Contains(t, info.Addrs[0], ":", "host:port")
	require.NotNil(t, info.Next, "TCP is the next path")
	require.Equal(t, "tcp", info.Next.Path())
	desc, err := info.Describe(context.Background())
	require.NoError(t, err)
	require.Equal(t, sm.target.Name(), desc.Name)

	// A path hands what it cannot serve to the next: the bytes arrive
	// over real TCP.
	b := sm.read(t, 0, 3*seamSlice)
	for _, s := range sm.take(t, 3) {
		info.Next.Submit(context.Background(), s)
	}
	st := sm.wait(t, b)
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, sm.remote[:3*seamSlice], sm.local[:3*seamSlice])
}

// TestSeamSlicesSettleInAnyOrder: a task completes when its last slice
// does, whatever the order, and its checksum combines per-slice terms
// taken out of order.
func TestSeamSlicesSettleInAnyOrder(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, 4*seamSlice, engine.WithChecksum())
	sl := sm.take(t, 4)
	for i, k := range []int{3, 1, 0} {
		transporttest.Move(sl[k])
		st, err := sm.init.TaskStatus(b, 0)
		require.NoError(t, err)
		require.Equal(t, engine.Pending, st.Status, "after %d of 4 slices", i+1)
		require.Equal(t, uint64((i+1)*seamSlice), st.Transferred)
	}
	transporttest.Move(sl[2])
	st := sm.wait(t, b)
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	task, err := sm.init.TaskStatus(b, 0)
	require.NoError(t, err)
	require.Equal(t, crc32c.Checksum(sm.remote[:4*seamSlice]), task.Checksum)
	require.Equal(t, sm.remote[:4*seamSlice], sm.local[:4*seamSlice])
	require.NoError(t, sm.init.FreeBatch(b))
}

// TestSeamRefusalOutranksConnectionErrors: a peer that hangs up on a
// refusal fails the slices queued behind it with connection errors; the
// task reports the refusal, whichever order they arrive in.
func TestSeamRefusalOutranksConnectionErrors(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	peerErr := errors.New("connection reset")
	for _, refusalFirst := range []bool{true, false} {
		b := sm.read(t, 0, 3*seamSlice)
		sl := sm.take(t, 3)
		rejected := func(s *transport.Slice) {
			transporttest.Fail(s, errors.Join(transport.ErrRejected, errors.New("not registered")))
		}
		if refusalFirst {
			rejected(sl[1])
			transporttest.Fail(sl[0], errors.Join(transport.ErrPeer, peerErr))
		} else {
			transporttest.Fail(sl[0], errors.Join(transport.ErrPeer, peerErr))
			rejected(sl[1])
		}
		transporttest.Move(sl[2])
		st := sm.wait(t, b)
		require.Equal(t, engine.Failed, st.Status)
		require.ErrorIs(t, st.Err, transport.ErrRejected, "refusal first: %v", refusalFirst)
		require.Equal(t, uint64(seamSlice), st.Transferred, "the slice that arrived counts")
		require.NoError(t, sm.init.FreeBatch(b))
	}
}

// TestSeamTimeoutStatus: one slice past its deadline makes the task
// Timeout, not Failed, while the others' bytes count.
func TestSeamTimeoutStatus(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, 2*seamSlice)
	sl := sm.take(t, 2)
	transporttest.Move(sl[0])
	transporttest.Fail(sl[1], errors.Join(transport.ErrTimeout, errors.New("no answer")))
	st := sm.wait(t, b)
	require.Equal(t, engine.Timeout, st.Status)
	require.ErrorIs(t, st.Err, transport.ErrTimeout)
	require.Equal(t, uint64(seamSlice), st.Transferred)
}

// TestSeamBusyBatch: a batch whose slices the path still holds cannot be
// freed; once they settle it can.
func TestSeamBusyBatch(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, seamSlice)
	sl := sm.take(t, 1)
	require.ErrorIs(t, sm.init.FreeBatch(b), engine.ErrBatchBusy)
	transporttest.Move(sl[0])
	require.Equal(t, engine.Completed, sm.wait(t, b).Status)
	require.NoError(t, sm.init.FreeBatch(b))
}

// TestSeamCloseFailsHeldSlices: closing the engine closes its paths,
// which fail what they hold, and Close does not wait for answers that may
// never come. A slice settled after Close still settles its task.
func TestSeamCloseFailsHeldSlices(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, 2*seamSlice)
	kept := sm.take(t, 1)[0] // the fake holds the other
	done := make(chan engine.TransferStatus, 1)
	go func() {
		st, _ := sm.init.Wait(context.Background(), b)
		done <- st
	}()
	require.NoError(t, sm.init.Close())
	transporttest.Move(kept)
	select {
	case st := <-done:
		require.Equal(t, engine.Failed, st.Status)
		require.ErrorIs(t, st.Err, transport.ErrClosed)
		require.Equal(t, uint64(seamSlice), st.Transferred)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	_, err := sm.fake.Open(context.Background(), transport.PeerInfo{Name: "late"})
	require.ErrorIs(t, err, transport.ErrClosed, "the engine closed its path")
}

// TestSeamNotifyOnlyAfterSuccess: a batch with a notification sends it
// only once every slice succeeded; a failed one sends nothing.
func TestSeamNotifyOnlyAfterSuccess(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	failed := sm.read(t, 0, seamSlice, engine.WithNotify(engine.Notify{Name: "n", Msg: "failed"}))
	transporttest.Fail(sm.take(t, 1)[0], errors.Join(transport.ErrPeer, errors.New("reset")))
	require.Equal(t, engine.Failed, sm.wait(t, failed).Status)
	ok := sm.read(t, 0, seamSlice, engine.WithNotify(engine.Notify{Name: "n", Msg: "ok"}))
	transporttest.Move(sm.take(t, 1)[0])
	require.Equal(t, engine.Completed, sm.wait(t, ok).Status)
	var got []engine.Notify
	eventually(t, func() bool {
		got = append(got, sm.target.Notifies()...)
		return len(got) > 0
	})
	// Notifications of one initiator arrive in the order sent, so had the
	// failed batch sent one it would be here first.
	require.Equal(t, []engine.Notify{{Name: "n", Msg: "ok"}}, got)
}

// TestSeamInline: a path that takes inline sends gets the slices of a
// small Submit from the caller, and the engine's Wait reads their answers
// itself; a status poll instead releases them to the path.
func TestSeamInline(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{Inline: true})
	b := sm.read(t, 0, 2*seamSlice)
	go func() {
		for _, s := range sm.take(t, 2) {
			transporttest.Move(s)
		}
	}()
	require.Equal(t, engine.Completed, sm.wait(t, b).Status)
	waited, released := sm.fake.Inlined()
	require.Equal(t, [2]int{1, 0}, [2]int{waited, released}, "Wait read the answers")

	b = sm.read(t, 0, seamSlice)
	st, err := sm.init.BatchStatus(b)
	require.NoError(t, err)
	require.Equal(t, engine.Pending, st.Status)
	waited, released = sm.fake.Inlined()
	require.Equal(t, [2]int{1, 1}, [2]int{waited, released}, "a poll releases them")
	transporttest.Move(sm.take(t, 1)[0])
	require.Equal(t, engine.Completed, sm.wait(t, b).Status)

	// A notify needs completion seen without the caller: never inline.
	b = sm.read(t, 0, seamSlice, engine.WithNotify(engine.Notify{Name: "n"}))
	transporttest.Move(sm.take(t, 1)[0])
	require.Equal(t, engine.Completed, sm.wait(t, b).Status)
	waited, released = sm.fake.Inlined()
	require.Equal(t, [2]int{1, 1}, [2]int{waited, released})
}

// TestSeamPathChoice: a path that declines a peer leaves it to the next
// one (TCP moves the bytes); a path that fails to open fails the opening,
// with the path named.
func TestSeamPathChoice(t *testing.T) {
	declined := newSeam(t, &transporttest.Fake{Accept: func(transport.PeerInfo) bool { return false }})
	require.Empty(t, declined.fake.Opened())
	st := transfer(t, declined.init, []engine.Request{{Op: engine.Read, Local: addr(declined.local),
		Segment: declined.seg, Remote: uint64(addr(declined.remote)), Length: 3 * seamSlice}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, declined.remote[:3*seamSlice], declined.local[:3*seamSlice])

	target := newEngine(t, engine.Config{Transport: "tcp"})
	bad := errors.New("device lost")
	init := newEngine(t, engine.Config{Transport: "tcp", Transports: []transport.Transport{&transporttest.Fake{OpenErr: bad}}})
	_, err := init.OpenSegment(context.Background(), target.Name())
	require.ErrorIs(t, err, bad)
	require.ErrorContains(t, err, "fake path")
}

// TestSubmitContextDoesNotCancelQueued: Submit's context bounds queueing
// only; ending it after Submit returned leaves the transfer going.
func TestSubmitContextDoesNotCancelQueued(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	ctx, cancel := context.WithCancel(context.Background())
	b, err := sm.init.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, sm.init.Submit(ctx, b, []engine.Request{{Op: engine.Read, Local: addr(sm.local),
		Segment: sm.seg, Remote: uint64(addr(sm.remote)), Length: seamSlice}}))
	cancel()
	transporttest.Move(sm.take(t, 1)[0])
	require.Equal(t, engine.Completed, sm.wait(t, b).Status, "ctx bounds queueing, not the transfer")
}

// TestDataAddressList: a peer whose descriptor lists more data addresses
// (mcgo_tcp_data_addrs) is reached through them when the first one fails;
// the same descriptor without them fails the transfer.
func TestDataAddressList(t *testing.T) {
	ctx := context.Background()
	meta := "memory://" + t.Name()
	target := newEngine(t, engine.Config{Metadata: meta, Transport: "tcp"})
	remote := anonMem(t, 1<<20)
	for i := range remote {
		remote[i] = byte(i*5 + 3)
	}
	require.NoError(t, target.RegisterMemory(ctx, addr(remote), uint64(len(remote)), "", true))

	store := metadata.OpenMemory(t.Name())
	raw, err := store.Get(ctx, metadata.SegmentKey(target.Name()))
	require.NoError(t, err)
	desc, err := metadata.ParseSegmentDesc(raw)
	require.NoError(t, err)
	_, deadPort, err := net.SplitHostPort(nettest.RefusedAddr(t))
	require.NoError(t, err)
	live := net.JoinHostPort(desc.TCPDataHost, strconv.Itoa(desc.TCPDataPort))
	desc.TCPDataHost = "127.0.0.1"
	desc.TCPDataPort, err = strconv.Atoi(deadPort)
	require.NoError(t, err)
	publish := func(addrs []string) {
		desc.TCPDataAddrs = addrs
		b, err := json.Marshal(desc)
		require.NoError(t, err)
		require.NoError(t, store.Put(ctx, metadata.SegmentKey(target.Name()), b))
	}
	read := func() engine.TransferStatus {
		init := newEngine(t, engine.Config{Metadata: meta, Transport: "tcp", SliceSize: 64 << 10})
		local := anonMem(t, len(remote))
		require.NoError(t, init.RegisterMemory(ctx, addr(local), uint64(len(local)), "", false))
		seg, err := init.OpenSegment(ctx, target.Name())
		require.NoError(t, err)
		st := transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(local), Segment: seg,
			Remote: uint64(addr(remote)), Length: uint64(len(remote))}})
		if st.Status == engine.Completed {
			require.Equal(t, remote, local)
		}
		return st
	}

	publish([]string{live})
	st := read()
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)

	publish(nil)
	st = read()
	require.Equal(t, engine.Failed, st.Status)
	require.ErrorIs(t, st.Err, transport.ErrPeer)
}

// TestConcurrentOpenSegment: threads opening one peer at once get one
// segment, and the openers that lost the race release only what they
// opened: the lanes of the segment that won keep moving bytes.
func TestConcurrentOpenSegment(t *testing.T) {
	ctx := context.Background()
	target := newEngine(t, engine.Config{Transport: "tcp"})
	remote := anonMem(t, 64<<10)
	for i := range remote {
		remote[i] = byte(i*3 + 7)
	}
	require.NoError(t, target.RegisterMemory(ctx, addr(remote), uint64(len(remote)), "", true))
	for round := range 5 {
		init := newEngine(t, engine.Config{Transport: "tcp"})
		local := anonMem(t, len(remote))
		require.NoError(t, init.RegisterMemory(ctx, addr(local), uint64(len(local)), "", false))
		const n = 8
		ids := make(chan engine.SegmentID, n)
		start := make(chan struct{})
		for range n {
			go func() {
				<-start
				id, err := init.OpenSegment(ctx, target.Name())
				if err != nil {
					t.Error(err)
				}
				ids <- id
			}()
		}
		close(start)
		first := <-ids
		for range n - 1 {
			require.Equal(t, first, <-ids, "round %d: one segment", round)
		}
		st := transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(local), Segment: first,
			Remote: uint64(addr(remote)), Length: uint64(len(remote))}})
		require.Equal(t, engine.Completed, st.Status, "round %d: %v", round, st.Err)
		require.Equal(t, remote, local)
	}
}

// TestSeamDeadlineBoundedByTimeout: WithDeadline brings a request's
// deadline forward, never past Config.Timeout from submission: the store
// passes its lease as the deadline, and an operator's MC_TRANSFER_TIMEOUT
// must still bound a read from a peer that does not answer.
func TestSeamDeadlineBoundedByTimeout(t *testing.T) {
	fake := &transporttest.Fake{}
	target := newEngine(t, engine.Config{Transport: "tcp"})
	remote := anonMem(t, 1<<16)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(remote), uint64(len(remote)), "", true))
	const timeout = 2 * time.Second
	init := newEngine(t, engine.Config{Transport: "tcp", Timeout: timeout, Transports: []transport.Transport{fake}})
	local := anonMem(t, 1<<16)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(local), uint64(len(local)), "", false))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	sm := &seam{fake: fake, init: init, target: target, seg: seg, local: local, remote: remote}

	for _, c := range []struct {
		name string
		in   time.Duration // WithDeadline from now; 0: none
		want time.Duration // the slice's deadline from now
	}{
		{"none", 0, timeout},
		{"earlier", 500 * time.Millisecond, 500 * time.Millisecond},
		{"later", time.Hour, timeout},
	} {
		var opts []engine.SubmitOption
		now := time.Now()
		if c.in > 0 {
			opts = append(opts, engine.WithDeadline(now.Add(c.in)))
		}
		b := sm.read(t, 0, 1024, opts...)
		s := sm.take(t, 1)[0]
		require.WithinDuration(t, now.Add(c.want), s.Deadline, 200*time.Millisecond, c.name)
		transporttest.Move(s)
		require.Equal(t, engine.Completed, sm.wait(t, b).Status, c.name)
		require.NoError(t, init.FreeBatch(b))
	}
}

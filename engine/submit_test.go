package engine_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// A call whose requests go to several peers keeps them all busy: a peer
// whose queue is full (its process stopped, here) does not hold back the
// slices of another peer queued after it in the call, as it would when the
// call queued one peer's slices after another's (the pieces of a striped
// value, each more slices than a queue holds, then moved one at a time).
func TestSubmitDoesNotQueueBehindAFullPeer(t *testing.T) {
	stalled, proc := startTarget(t, "tcp", "")
	live, _ := startTarget(t, "tcp", "")
	const slice = 16 << 10
	init := newEngine(t, engine.Config{Transport: "tcp", SliceSize: slice})
	const big = 2048 * slice // twice the slices a TCP peer queues
	dst := anonMem(t, big+1<<20)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(dst), uint64(len(dst)), "", true))
	segA, err := init.OpenSegment(context.Background(), stalled.Name)
	require.NoError(t, err)
	segB, err := init.OpenSegment(context.Background(), live.Name)
	require.NoError(t, err)
	require.NoError(t, proc.Signal(syscall.SIGSTOP))

	b, err := init.AllocateBatch(2)
	require.NoError(t, err)
	reqs := []engine.Request{
		{Op: engine.Read, Local: addr(dst), Segment: segA, Remote: stalled.Addr, Length: big},
		{Op: engine.Read, Local: addr(dst[big:]), Segment: segB, Remote: live.Addr, Length: 1 << 20},
	}
	deadline := time.Now().Add(20 * time.Second)
	submitted := make(chan error, 1)
	go func() { submitted <- init.Submit(context.Background(), b, reqs, engine.WithDeadline(deadline)) }()
	var st engine.TransferStatus
	for wait := time.Now().Add(10 * time.Second); time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
		if st, err = init.TaskStatus(b, 1); err == nil && st.Status.Done() {
			break
		}
	}
	require.NoError(t, err)
	require.Equal(t, engine.Completed, st.Status, "the live peer's read, while the other peer is stopped: %v", st.Err)

	require.NoError(t, proc.Signal(syscall.SIGCONT))
	require.NoError(t, <-submitted)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(5*time.Second))
	defer cancel()
	all, err := init.Wait(ctx, b)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, all.Status, "%v", all.Err)
	require.NoError(t, init.FreeBatch(b))
}

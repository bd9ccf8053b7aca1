package master

import (
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/store/storepb"
)

const (
	evPut     = storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT
	evRemoved = storepb.ObjectEventKind_OBJECT_EVENT_KIND_REMOVED
	evEvicted = storepb.ObjectEventKind_OBJECT_EVENT_KIND_EVICTED
)

// drain returns the events waiting in w.
func drain(w *Watch) []ObjectEvent {
	var out []ObjectEvent
	for {
		select {
		case ev := <-w.Events():
			out = append(out, ev)
		default:
			return out
		}
	}
}

func TestWatch(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 10*1024)))
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("2", 1<<32, 1<<20)))
	put(t, s, "a", "before", 1024, nil)
	_, err := s.PutStart(t.Context(), "a", "pending", 64, nil)
	require.NoError(t, err)

	// The snapshot: readable keys only.
	w, keys := s.Watch(0)
	defer w.Close()
	assert.Equal(t, []string{"before"}, keys)
	assert.Empty(t, drain(w))

	// A put is seen when it ends, not when it starts; a revoke is not seen.
	require.NoError(t, s.PutEnd(t.Context(), "a", "pending", 0))
	_, err = s.PutStart(t.Context(), "a", "revoked", 64, nil)
	require.NoError(t, err)
	require.NoError(t, s.PutRevoke(t.Context(), "a", "revoked"))
	// An upsert of a readable key is a put again.
	_, err = s.UpsertStart(t.Context(), "a", "before", 1024, nil)
	require.NoError(t, err)
	require.NoError(t, s.UpsertEnd(t.Context(), "a", "before", 0))
	require.NoError(t, s.Remove(t.Context(), "pending", true))
	assert.Equal(t, []ObjectEvent{{evPut, "pending"}, {evPut, "before"}, {evRemoved, "pending"}}, drain(w))

	// Eviction: a forced round (as after a failed allocation) frees at
	// least 5% of the pool, here every object.
	for i := range 9 {
		clk.Advance(1)
		put(t, s, "a", fmt.Sprint("k", i), 1024, nil)
	}
	drain(w)
	s.needEvict.Store(true)
	require.NotZero(t, s.Evict())
	evicted := drain(w)
	assert.Len(t, evicted, 10)
	for _, ev := range evicted {
		assert.Equal(t, evEvicted, ev.Kind, ev.Key)
		ok, err := s.ExistKey(ev.Key)
		require.NoError(t, err)
		assert.False(t, ok, "%s evicted but readable", ev.Key)
	}

	// An unmounted segment takes the keys whose only replica it held.
	put(t, s, "b", "on2", 64, &storepb.ReplicateConfig{PreferredSegments: []string{"node-2"}})
	drain(w)
	require.NoError(t, s.UnmountSegment(t.Context(), "b", "2"))
	assert.Equal(t, []ObjectEvent{{evEvicted, "on2"}}, drain(w))

	// RemoveAll removes one by one.
	n := s.RemoveAll(t.Context(), true)
	got := drain(w)
	assert.Len(t, got, n)
	for _, ev := range got {
		assert.Equal(t, evRemoved, ev.Kind)
	}

	// Closed, a watch gets nothing and ends without an error.
	w.Close()
	w.Close()
	put(t, s, "a", "after", 64, nil)
	assert.Empty(t, drain(w))
	<-w.Done()
	assert.NoError(t, w.Err())
}

func TestWatchBehind(t *testing.T) {
	// A watcher that does not read is dropped once its buffer is full;
	// puts never wait for it, and other watchers go on.
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 1<<20)))
	slow, _ := s.Watch(2)
	fast, _ := s.Watch(100)
	defer fast.Close()
	for i := range 3 {
		put(t, s, "a", fmt.Sprint("k", i), 64, nil)
	}
	<-slow.Done()
	assert.ErrorIs(t, slow.Err(), ErrWatchBehind)
	assert.Len(t, drain(slow), 2)
	assert.Len(t, drain(fast), 3)
	assert.NoError(t, fast.Err())

	s.endWatches()
	<-fast.Done()
	assert.ErrorIs(t, fast.Err(), ErrWatchEnded)
}

func TestWatchGRPC(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	// More readable keys than one batch carries.
	const n = watchBatch + 10
	for i := range n {
		put(t, f.svc, "c1", fmt.Sprint("k", i), 64, nil)
	}
	stream, err := f.c.WatchObjects(f.ctx, &storepb.WatchObjectsRequest{})
	require.NoError(t, err)
	seen := map[string]bool{}
	for synced := false; !synced; {
		resp, err := stream.Recv()
		require.NoError(t, err)
		for _, ev := range resp.Events {
			require.Equal(t, evPut, ev.Kind)
			seen[ev.Key] = true
		}
		synced = resp.Synced
	}
	assert.Len(t, seen, n)

	// Then the changes, in order.
	put(t, f.svc, "c1", "new", 64, nil)
	require.NoError(t, f.svc.Remove(t.Context(), "k0", true))
	var got []ObjectEvent
	for len(got) < 2 {
		resp, err := stream.Recv()
		require.NoError(t, err)
		assert.False(t, resp.Synced)
		for _, ev := range resp.Events {
			got = append(got, ObjectEvent{ev.Kind, ev.Key})
		}
	}
	assert.Equal(t, []ObjectEvent{{evPut, "new"}, {evRemoved, "k0"}}, got)

	// A master that stops serving ends the stream: watch again.
	f.svc.endWatches()
	_, err = stream.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.NotErrorIs(t, err, io.EOF)
}

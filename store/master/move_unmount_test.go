package master

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// holdMoves is a memJournal whose first append of a move's end (a
// JournalMove) waits, before it takes its sequence number, until release
// is closed; it says so on held.
type holdMoves struct {
	*memJournal
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (j *holdMoves) append(rec *storepb.JournalRecord, done func()) uint64 {
	if rec.GetMove() != nil {
		j.once.Do(func() {
			close(j.held)
			<-j.release
		})
	}
	return j.memJournal.append(rec, done)
}

// endBehindUnmount ends move id of client (MoveEnd) with its record held
// while client src unmounts segment seg: the unmount's record goes in
// first, and its sweep waits for the move's end (which holds the object's
// shard).
func endBehindUnmount(t *testing.T, s *Service, j *memJournal, client string, id uint64, src, seg string) {
	t.Helper()
	g := &holdMoves{memJournal: j, held: make(chan struct{}), release: make(chan struct{})}
	s.j = g
	ended := make(chan error, 1)
	go func() { ended <- s.MoveEnd(context.Background(), client, id, true) }()
	<-g.held
	unmounted := make(chan error, 1)
	go func() { unmounted <- s.UnmountSegment(context.Background(), src, seg) }()
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.recs[len(j.recs)-1].GetUnmount() != nil
	}, 5*time.Second, time.Millisecond, "the unmount's record")
	close(g.release)
	<-ended // its answer does not matter: the records and the state do
	require.NoError(t, <-unmounted)
}

// sameView checks that a new leader replaying j's records holds what s
// holds: each key's replicas (segment and offset), and each segment's use.
func sameView(t *testing.T, s *Service, j *memJournal, keys ...string) {
	t.Helper()
	s2, _ := replayed(t, j.recs)
	for _, k := range keys {
		r1, _, _, _, err1 := s.GetReplicaList(k)
		r2, _, _, _, err2 := s2.GetReplicaList(k)
		require.Equal(t, err1 == nil, err2 == nil, "%s: leader %v, replayed %v", k, err1, err2)
		require.Len(t, r2, len(r1), k)
		for i := range r1 {
			assert.Equal(t, mem(r1[i]).GetSegmentName(), mem(r2[i]).GetSegmentName(), k)
			assert.Equal(t, mem(r1[i]).GetBufferAddress(), mem(r2[i]).GetBufferAddress(), k)
		}
	}
	for id, sg := range s.segs {
		sg2 := s2.segs[id]
		require.NotNil(t, sg2, "segment %s", id)
		assert.Equal(t, sg.alloc.Used(), sg2.alloc.Used(), "segment %s in use", id)
	}
	assert.Equal(t, len(s.segs), len(s2.segs))
	checkNoOverlap(t, s)
	checkNoOverlap(t, s2)
}

// A move that ends while its source's segment is unmounting, its record
// behind the unmount's, leaves the leader and a new leader replaying the
// records in the same state. A drain's move gives its target back (the
// replica it would move went with the segment, and with it the object,
// which had no other); a spill still lands on the SSD tier (it takes every
// DRAM replica, the dead one too).
func TestMoveEndsBehindItsSourcesUnmount(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		s, j, _, _ := drainFixture(t, 1)
		s.stepDrains()
		tasks := s.takeTasks(t.Context(), "c1")
		require.Len(t, tasks, 1)
		endBehindUnmount(t, s, j, "c1", tasks[0].Id, "c1", "1")
		_, _, _, _, err := s.GetReplicaList("k0")
		require.ErrorIs(t, err, storepb.ErrObjectNotFound, "its one replica went with the segment")
		sameView(t, s, j, "k0")
	})
	t.Run("spill", func(t *testing.T) {
		s, _ := newTestService(t, ServiceConfig{})
		j := &memJournal{}
		s.j = j
		task := spillQueued(t, s)
		tasks := s.takeTasks(t.Context(), "a")
		require.Len(t, tasks, 1)
		require.Equal(t, task.id, tasks[0].Id)
		endBehindUnmount(t, s, j, "a", tasks[0].Id, "a", "1")
		reps, _, _, _, err := s.GetReplicaList("k")
		require.NoError(t, err)
		require.Len(t, reps, 1)
		assert.Equal(t, storepb.Medium_MEDIUM_DISK, mem(reps[0]).GetMedium(), "on the tier")
		sameView(t, s, j, "k")
	})
}

package master

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// moveUnit is the size of the objects of these tests; the DRAM segment
// takes four.
const moveUnit = 16 << 10

// mountTier mounts client a's DRAM segment "1" of four units and, if
// tier, its SSD tier "2".
func mountTier(t *testing.T, s *Service, tier bool) {
	t.Helper()
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 1<<20, 4*moveUnit)))
	if tier {
		disk := seg("2", 1<<30, 16*moveUnit)
		disk.Medium = storepb.Medium_MEDIUM_DISK
		require.NoError(t, s.MountSegment(t.Context(), "a", disk))
	}
}

// evict runs key's eviction (forced: its DRAM replica goes, as it has an
// SSD copy; else it spills) and returns the object's move then.
func evict(s *Service, key string, force bool) *moveTask {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.evictLocked(sh, key, sh.objects[key], force)
	if o := sh.objects[key]; o != nil {
		return o.moving
	}
	return nil
}

// promotionQueued puts k on a's tier alone (offloaded, its DRAM replica
// evicted) and reads it, which queues its promotion into "1".
func promotionQueued(t *testing.T, s *Service, clk *fakeClock) {
	t.Helper()
	put(t, s, "a", "k", moveUnit, nil)
	tasks := s.takeTasks(t.Context(), "a")
	require.Len(t, tasks, 1, "the put's offload")
	require.NoError(t, s.MoveEnd(t.Context(), "a", tasks[0].Id, true))
	evict(s, "k", true)
	clk.Advance(time.Second)
	_, _, _, _, err := s.GetReplicaList("k")
	require.NoError(t, err)
}

// spillQueued puts k in a's DRAM before the tier is mounted (no offload)
// and evicts it, which queues its spill; it returns the spill.
func spillQueued(t *testing.T, s *Service) *moveTask {
	t.Helper()
	mountTier(t, s, false)
	put(t, s, "a", "k", moveUnit, nil)
	disk := seg("2", 1<<30, 16*moveUnit)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(t.Context(), "a", disk))
	task := evict(s, "k", false)
	require.NotNil(t, task, "the eviction spills")
	return task
}

// promotionHanded sets up client a with a DRAM segment of four units and
// an SSD tier, an object k on SSD only, and a read of it whose promotion
// into DRAM has been handed to a: a copies into the returned target.
func promotionHanded(t *testing.T, j journal) (*Service, *fakeClock, *storepb.MoveTask) {
	t.Helper()
	s, clk := newTestService(t, ServiceConfig{})
	s.j = j
	mountTier(t, s, true)
	promotionQueued(t, s, clk)
	tasks := s.takeTasks(t.Context(), "a")
	require.Len(t, tasks, 1, "the read's promotion")
	require.Equal(t, storepb.Medium_MEDIUM_DRAM, tasks[0].Target.Medium)
	return s, clk, tasks[0]
}

// replayed is a new leader restored from recs.
func replayed(t *testing.T, recs []*storepb.JournalRecord) (*Service, *fakeClock) {
	t.Helper()
	st := newState()
	for i, r := range recs {
		require.NoError(t, st.apply(r), "record %d %v", i+1, r)
	}
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.restore(st))
	return s, clk
}

// overlaps reports whether any replica of s's objects, readable or in
// flight, shares a byte with target.
func overlaps(s *Service, target *storepb.MemoryReplica) []string {
	var hit []string
	for i := range s.shards {
		for key, o := range s.shards[i].objects {
			reps := o.replicas
			if o.pending != nil {
				reps = append(reps[:len(reps):len(reps)], o.pending.replicas...)
			}
			for _, r := range reps {
				at := r.seg.base + r.off
				if r.seg.name == target.SegmentName && at < target.BufferAddress+target.Size && target.BufferAddress < at+r.size {
					hit = append(hit, key)
				}
			}
		}
	}
	return hit
}

// A move's target handed to a client stays taken on the next leader until
// the client reports: puts there land elsewhere, the client's report
// frees it, and so does the move's expiry. Without the move's start in
// the journal (the negative control) the next leader gives the space a
// copy is still writing into to a put.
func TestMoveTargetKeptByNextLeader(t *testing.T) {
	for _, journaled := range []bool{true, false} {
		t.Run(fmt.Sprintf("journaled=%v", journaled), func(t *testing.T) {
			ctx := t.Context()
			j := &memJournal{}
			old, _, task := promotionHanded(t, j)
			recs := j.recs
			if !journaled {
				recs = nil
				for _, r := range j.recs {
					if r.GetMoveStart() == nil {
						recs = append(recs, r)
					}
				}
			}
			s, clk := replayed(t, recs)
			if journaled {
				assert.Equal(t, view(old), view(s))
			}
			// DRAM has room for three units besides the target; the
			// fourth put evicts.
			for i := range 4 {
				put(t, s, "a", fmt.Sprint("new", i), moveUnit, nil)
			}
			hit := overlaps(s, task.Target)
			if !journaled {
				require.NotEmpty(t, hit, "without the records a put lands on the target")
				return
			}
			require.Empty(t, hit, "puts on the next leader got space a copy is writing into")

			// The client's report ends the move on the next leader: the
			// object is not told, the space is free again, and the abort
			// is journaled for the leader after.
			j2 := &memJournal{}
			s.j = j2
			err := s.MoveEnd(ctx, "a", task.Id, true)
			require.ErrorIs(t, err, storepb.ErrObjectNotFound)
			require.NotContains(t, s.tasks, task.Id)
			require.Len(t, j2.recs, 1)
			assert.Equal(t, task.Id, j2.recs[0].GetMoveAbort().GetId())
			clk.Advance(time.Hour) // the new objects' leases
			put(t, s, "a", "after", moveUnit, nil)
			assert.NotEmpty(t, overlaps(s, task.Target), "the freed target is used again")

			// New moves are numbered after the old leader's.
			_, _, _, _, err = s.GetReplicaList("k")
			require.NoError(t, err)
			tasks := s.takeTasks(ctx, "a")
			require.NotEmpty(t, tasks)
			for _, nt := range tasks {
				assert.Greater(t, nt.Id, task.Id)
			}
		})
	}
}

// A move handed out and never reported expires on the next leader too,
// journaling its abort.
func TestMoveTargetExpiresOnNextLeader(t *testing.T) {
	j := &memJournal{}
	old, _, task := promotionHanded(t, j)
	s, clk := replayed(t, j.recs)
	j2 := &memJournal{}
	s.j = j2
	dram := s.segs["1"]
	used := dram.alloc.Used()
	require.Equal(t, view(old), view(s))
	clk.Advance(moveTaskTTL - time.Second)
	s.expireTasks()
	require.Len(t, s.tasks, 1, "not yet")
	clk.Advance(time.Second)
	s.expireTasks()
	require.Empty(t, s.tasks)
	assert.Equal(t, used-moveUnit, dram.alloc.Used())
	require.Len(t, j2.recs, 1)
	assert.Equal(t, task.Id, j2.recs[0].GetMoveAbort().GetId())
	// The client's late report finds nothing.
	require.ErrorIs(t, s.MoveEnd(t.Context(), "a", task.Id, true), storepb.ErrObjectNotFound)
}

// Every way a journaled move ends leaves a replay with the leader's
// state: done (the target is the object's), failed, its object changed,
// expired, its target's segment unmounted (and mounted again with the same
// id: no stale claim on the new mount), its client expired.
func TestMoveEndsReplayed(t *testing.T) {
	ctx := t.Context()
	check := func(t *testing.T, s *Service, j *memJournal) {
		t.Helper()
		s2, _ := replayed(t, j.recs)
		assert.Equal(t, view(s), view(s2))
	}
	t.Run("done", func(t *testing.T) {
		j := &memJournal{}
		s, _, task := promotionHanded(t, j)
		check(t, s, j)
		require.NoError(t, s.MoveEnd(ctx, "a", task.Id, true))
		assert.Equal(t, task.Id, j.recs[len(j.recs)-1].GetMove().GetId())
		check(t, s, j)
	})
	t.Run("failed", func(t *testing.T) {
		j := &memJournal{}
		s, _, task := promotionHanded(t, j)
		require.NoError(t, s.MoveEnd(ctx, "a", task.Id, false))
		check(t, s, j)
	})
	t.Run("changed", func(t *testing.T) {
		j := &memJournal{}
		s, _, task := promotionHanded(t, j)
		require.NoError(t, s.Remove(ctx, "k", true))
		check(t, s, j)
		require.ErrorIs(t, s.MoveEnd(ctx, "a", task.Id, true), storepb.ErrObjectNotFound)
		check(t, s, j)
	})
	t.Run("expired", func(t *testing.T) {
		j := &memJournal{}
		s, clk, _ := promotionHanded(t, j)
		clk.Advance(moveTaskTTL)
		s.expireTasks()
		check(t, s, j)
	})
	t.Run("target unmounted", func(t *testing.T) {
		j := &memJournal{}
		s, _, task := promotionHanded(t, j)
		// The promotion's target is on a; the tier (its source) stays.
		require.NoError(t, s.UnmountSegment(ctx, "a", "1"))
		check(t, s, j)
		require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 4*moveUnit)))
		for i := range 4 {
			put(t, s, "a", fmt.Sprint("new", i), moveUnit, nil)
		}
		// Their offloads, not handed out, hold tier space in memory only.
		for _, tk := range s.takeTasks(ctx, "a") {
			require.NoError(t, s.MoveEnd(ctx, "a", tk.Id, false))
		}
		check(t, s, j)
		require.Error(t, s.MoveEnd(ctx, "a", task.Id, true))
		check(t, s, j)
	})
	t.Run("client expired", func(t *testing.T) {
		j := &memJournal{}
		s, clk, _ := promotionHanded(t, j)
		clk.Advance(time.Hour)
		require.Equal(t, 1, s.ExpireClients())
		check(t, s, j)
	})
}

// A snapshot holds the targets of the moves in flight, whether it is
// copied shard by shard or under every lock, and the moves' ends after it
// replay onto it.
func TestMoveTargetInSnapshot(t *testing.T) {
	ctx := t.Context()
	for _, locked := range []bool{false, true} {
		t.Run(fmt.Sprintf("locked=%v", locked), func(t *testing.T) {
			dir := t.TempDir()
			j, err := openFileJournal(dir, 0, 0, 1, slog.Default())
			require.NoError(t, err)
			defer j.close()
			s, clk, task := promotionHanded(t, j)
			// A second promotion, handed out too, to end after the snapshot.
			put(t, s, "a", "k2", moveUnit, nil)
			for _, tk := range s.takeTasks(ctx, "a") {
				require.NoError(t, s.MoveEnd(ctx, "a", tk.Id, true))
			}
			evict(s, "k2", true)
			clk.Advance(time.Second)
			_, _, _, _, err = s.GetReplicaList("k2")
			require.NoError(t, err)
			second := s.takeTasks(ctx, "a")
			require.Len(t, second, 1)

			var chunks []*storepb.SnapshotChunk
			var seq uint64
			if locked {
				chunks, seq = s.snapshotLocked(1)
			} else {
				st, n, err := s.snapshotShards()
				require.NoError(t, err)
				chunks, seq = st.chunks(1), n
			}
			require.NoError(t, j.wait(ctx, seq))
			moves := 0
			for _, c := range chunks {
				moves += len(c.Moves)
				require.LessOrEqual(t, len(c.Objects)+len(c.Moves), 1, "a chunk over its bound")
			}
			require.Equal(t, 2, moves)
			require.Equal(t, view(s), view(restoredFrom(t, chunks, dir, seq)), "at the snapshot")

			require.NoError(t, s.MoveEnd(ctx, "a", task.Id, true))
			require.NoError(t, s.MoveEnd(ctx, "a", second[0].Id, false))
			require.NoError(t, j.wait(ctx, j.last()))
			require.Equal(t, view(s), view(restoredFrom(t, chunks, dir, seq)), "the snapshot and the records after it")
		})
	}
}

// A move that ends while a snapshot copies the shards, after the moves
// were copied and before its object's shard: the snapshot has the object
// with its new replica, and the move's record, applied to the copy, ends
// the reservation (or the target would be claimed twice).
func TestMoveEndsDuringSnapshot(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	j, err := openFileJournal(dir, 0, 0, 1, slog.Default())
	require.NoError(t, err)
	defer j.close()
	s, _, task := promotionHanded(t, j)
	k := s.shardIndex("k")
	require.Positive(t, k, "k's shard is copied after another")
	snapshotShardCopied = func(i int) {
		if i == 0 {
			require.NoError(t, s.MoveEnd(ctx, "a", task.Id, true))
		}
	}
	defer func() { snapshotShardCopied = nil }()
	st, seq, err := s.snapshotShards()
	require.NoError(t, err)
	require.NoError(t, j.wait(ctx, seq))
	require.Empty(t, st.moves)
	require.Equal(t, view(s), view(restoredFrom(t, st.chunks(1), dir, seq)))
}

// restoredFrom is a new leader restored from snapshot chunks (marshalled
// and read back) as of seq and the file journal in dir after it.
func restoredFrom(t *testing.T, chunks []*storepb.SnapshotChunk, dir string, seq uint64) *Service {
	t.Helper()
	st := loadChunks(t, chunks)
	_, err := replayFile(filepath.Join(dir, journalName(1)), st, seq, false, slog.Default())
	require.NoError(t, err)
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.restore(st))
	return s
}

// A move handed out while its record cannot be made durable is not handed
// out: the ping answers none, and a later ping hands it out once it is.
func TestMoveHandedOnlyOnceDurable(t *testing.T) {
	j := &failingJournal{}
	s, _ := newTestService(t, ServiceConfig{})
	s.j = j
	ctx := t.Context()
	mountTier(t, s, true)
	put(t, s, "a", "k", moveUnit, nil)
	j.fail = true
	assert.Empty(t, s.takeTasks(ctx, "a"), "handed out before its record was durable")
	j.fail, j.block = false, true
	start := time.Now()
	assert.Empty(t, s.takeTasks(ctx, "a"), "handed out before its record was durable")
	assert.Less(t, time.Since(start), 5*taskRecordWait, "a ping waited on a stuck journal")
	j.block = false
	tasks := s.takeTasks(ctx, "a")
	require.Len(t, tasks, 1)
	starts := 0
	for _, r := range j.recs {
		if r.GetMoveStart() != nil {
			starts++
		}
	}
	assert.Equal(t, 1, starts, "one record for the move")
}

// failingJournal is a memJournal whose waits fail while fail is set, and
// last until the caller gives up while block is.
type failingJournal struct {
	memJournal
	fail, block bool
}

func (j *failingJournal) wait(ctx context.Context, seq uint64) error {
	switch {
	case j.fail:
		return fmt.Errorf("journal record %d: etcd unreachable", seq)
	case j.block:
		<-ctx.Done()
		return ctx.Err()
	}
	return j.memJournal.wait(ctx, seq)
}

// A move whose target's segment went before the move was handed out (its
// owner expired and came back with the same segment id, whose space new
// puts took) is never handed out: the client would copy over those puts,
// and its journaled target would overlap them on the next leader.
func TestMoveNotHandedOnSegmentGone(t *testing.T) {
	j := &memJournal{}
	s, clk := newTestService(t, ServiceConfig{})
	s.j = j
	ctx := t.Context()
	mountTier(t, s, true)
	promotionQueued(t, s, clk)
	require.NoError(t, s.UnmountSegment(ctx, "a", "1"))
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 4*moveUnit)))
	for i := range 4 {
		put(t, s, "a", fmt.Sprint("new", i), moveUnit, nil)
	}
	for _, tk := range s.takeTasks(ctx, "a") {
		require.Equal(t, storepb.Medium_MEDIUM_DISK, tk.Target.Medium, "the promotion into the gone segment was handed out")
		require.NoError(t, s.MoveEnd(ctx, "a", tk.Id, false))
	}
	s2, _ := replayed(t, j.recs)
	assert.Equal(t, view(s), view(s2))
	clk.Advance(moveTaskTTL)
	s.expireTasks()
	assert.Empty(t, s.tasks)
}

// A spill whose source segment goes is detached from its object: the
// object goes with its last replica, the spill is never handed out, and
// its DRAM bytes no longer count as being freed (eviction would otherwise
// take that much too little until the move expired).
func TestSweepDetachesMoves(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	task := spillQueued(t, s)
	require.Equal(t, uint64(moveUnit), s.spilling)

	require.NoError(t, s.UnmountSegment(ctx, "a", "1"))
	ok, err := s.ExistKey("k")
	require.NoError(t, err)
	require.False(t, ok)
	s.segMu.Lock()
	defer s.segMu.Unlock()
	assert.Nil(t, task.o, "the spill still names the object gone")
	assert.Zero(t, s.spilling, "the spill's DRAM bytes still count as on their way out")
}

// Between a segment's removal and the sweep of its objects (the window a
// ping or a remount can fall in), a move onto it is not handed out.
func TestMoveNotHandedBeforeSweep(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	mountTier(t, s, true)
	promotionQueued(t, s, clk)
	s.segMu.Lock()
	s.segs["1"].dead.Store(true) // as removeSegLocked leaves it for the sweep
	s.segMu.Unlock()
	assert.Empty(t, s.takeTasks(t.Context(), "a"), "a promotion into a removed segment was handed out")
}

// A spill whose target tier goes while its object stays (a DRAM replica
// left) is detached too: the object may be moved again, and its DRAM
// bytes no longer count as on their way out.
func TestSweepDetachesMoveToGoneTier(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	spillQueued(t, s)
	require.NoError(t, s.UnmountSegment(ctx, "a", "2"))
	ok, err := s.ExistKey("k")
	require.NoError(t, err)
	require.True(t, ok, "k keeps its DRAM replica")
	sh := s.shardOf("k")
	sh.mu.Lock()
	assert.Nil(t, sh.objects["k"].moving, "k still waits for a spill into a gone tier")
	sh.mu.Unlock()
	s.segMu.Lock()
	defer s.segMu.Unlock()
	assert.Zero(t, s.spilling, "the spill's DRAM bytes still count as on their way out")
}

package master

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/alloc"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// memJournal is an in-memory journal: every record is durable at once.
type memJournal struct {
	mu   sync.Mutex
	recs []*storepb.JournalRecord
}

var _ journal = (*memJournal)(nil)

func (j *memJournal) append(rec *storepb.JournalRecord, done func()) uint64 {
	j.mu.Lock()
	j.recs = append(j.recs, proto.Clone(rec).(*storepb.JournalRecord))
	seq := uint64(len(j.recs))
	j.mu.Unlock()
	if done != nil {
		done()
	}
	return seq
}
func (j *memJournal) wait(context.Context, uint64) error { return nil }
func (j *memJournal) last() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return uint64(len(j.recs))
}

// restoredAfter is a Service restored from a snapshot's chunks and the
// records after it, as a new leader loads them.
func restoredAfter(t *testing.T, chunks []*storepb.SnapshotChunk, after []*storepb.JournalRecord) *Service {
	t.Helper()
	st := newState()
	for _, c := range chunks {
		require.NoError(t, st.loadChunk(c))
	}
	for i, r := range after {
		require.NoError(t, st.apply(r), "record %d after the snapshot", i+1)
	}
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.restore(st), "the snapshot and the journal after it restore")
	return s
}

// view is what must survive a failover: objects, their replicas by
// segment and address, the allocators' use, and the targets of moves
// handed out.
func view(s *Service) []string {
	var out []string
	for i := range s.shards {
		for key, o := range s.shards[i].objects {
			var reps []string
			for _, r := range o.replicas {
				rep := fmt.Sprintf("%s@%d+%d/%v", r.seg.id, r.off, r.size, r.seg.medium)
				if r.striped() {
					r.pieces(func(p replica) { rep += fmt.Sprintf("|%s@%d+%d", p.seg.id, p.off, p.size) })
				}
				reps = append(reps, rep)
			}
			p := ""
			if o.pending != nil {
				p = fmt.Sprintf(" pending(%s:%d)", o.pending.client, len(o.pending.replicas))
			}
			out = append(out, fmt.Sprintf("%s size=%d sum=%d %v%s", key, o.size, o.checksum, reps, p))
		}
	}
	for _, sg := range s.segList {
		out = append(out, fmt.Sprintf("seg %s client=%s used=%d", sg.id, sg.client, sg.alloc.Used()))
	}
	for _, m := range s.tasks {
		if m.journaled && !m.dst.dead() {
			out = append(out, fmt.Sprintf("move %d of %s by %s to %s@%d+%d", m.id, m.key, m.client, m.dst.seg.id, m.dst.off, m.dst.size))
		}
	}
	sort.Strings(out)
	return out
}

// loadChunks is a state loaded from snapshot chunks as a new leader reads
// them: marshalled and read back.
func loadChunks(t *testing.T, chunks []*storepb.SnapshotChunk) *state {
	t.Helper()
	st := newState()
	for _, c := range chunks {
		b, err := proto.Marshal(c)
		require.NoError(t, err)
		var back storepb.SnapshotChunk
		require.NoError(t, proto.Unmarshal(b, &back))
		require.NoError(t, st.loadChunk(&back))
	}
	return st
}

// Replaying the journal of a busy service (puts, upserts, revokes,
// removals, evictions, an unmount, an expiry, SSD moves) rebuilds its
// durable state exactly, and so does a snapshot plus the records after it.
func TestJournalReplayRebuildsState(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{ClientTTL: 5 * time.Second})
	j := &memJournal{}
	s.j = j
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 1<<20, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("2", 8<<20, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "c", seg("3", 16<<20, 1<<20)))
	disk := seg("4", 32<<20, 4<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(t.Context(), "a", disk))

	for i := range 40 {
		put(t, s, "a", fmt.Sprintf("k%d", i), uint64(1000+i*300), &storepb.ReplicateConfig{ReplicaNum: int32(1 + i%2)})
	}
	_, err := s.PutStart(t.Context(), "b", "inflight", 5000, nil)
	require.NoError(t, err)
	_, err = s.PutStart(t.Context(), "b", "revoked", 5000, nil)
	require.NoError(t, err)
	require.NoError(t, s.PutRevoke(t.Context(), "b", "revoked"))
	_, err = s.UpsertStart(t.Context(), "a", "k1", 7000, nil)
	require.NoError(t, err)
	require.NoError(t, s.PutEnd(t.Context(), "a", "k1", 99))
	require.NoError(t, s.Remove(t.Context(), "k2", true))
	// SSD moves: the offloads queued by the puts, done by client a.
	moved := 0
	for _, task := range s.takeTasks(t.Context(), "a") {
		// k1's offload finds the object replaced by the upsert.
		if err := s.MoveEnd(t.Context(), "a", task.Id, true); err == nil {
			moved++
		} else {
			require.ErrorIs(t, err, storepb.ErrObjectNotFound)
		}
	}
	require.Greater(t, moved, 10)
	clk.Advance(time.Minute) // leases end
	s.Ping("a")
	s.Ping("b")
	require.NoError(t, s.UnmountSegment(t.Context(), "b", "2"))
	require.Positive(t, s.evict(true), "a forced eviction takes something")
	s.Ping("a")
	clk.Advance(6 * time.Second)
	s.Ping("a")
	require.Equal(t, 2, s.ExpireClients(), "b and c expire")

	// Moves still queued (for b and c, whose segments are gone) hold SSD
	// space that is runtime state only; let them expire.
	clk.Advance(moveTaskTTL)
	s.expireTasks()
	want := view(s)
	replay := func(recs []*storepb.JournalRecord, st *state) []string {
		for i, r := range recs {
			require.NoError(t, st.apply(r), "record %d %v", i+1, r)
		}
		s2, _ := newTestService(t, ServiceConfig{})
		require.NoError(t, s2.restore(st))
		return view(s2)
	}
	assert.Equal(t, want, replay(j.recs, newState()))

	// A snapshot now, then more changes: snapshot + tail replays the same.
	chunks, seq := s.snapshot(7)
	require.Greater(t, len(chunks), 2)
	put(t, s, "a", "after", 3000, nil)
	// Remove some object eviction left (which ones it took varies).
	for i := range 40 {
		if err := s.Remove(t.Context(), fmt.Sprintf("k%d", i), true); err == nil {
			break
		}
	}
	st := loadChunks(t, chunks)
	clk.Advance(moveTaskTTL)
	s.expireTasks() // "after"'s offload
	assert.Equal(t, view(s), replay(j.recs[seq:], st))
}

func TestJournalApplyRejectsNonsense(t *testing.T) {
	cases := []struct {
		name string
		rec  *storepb.JournalRecord
	}{
		{"end without start", &storepb.JournalRecord{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{Key: "k"}}}},
		{"mount without segment", &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{}}}},
		{"move without object", &storepb.JournalRecord{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{Key: "k"}}}},
		{"move start without id", &storepb.JournalRecord{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{
			Key: "k", To: &storepb.ReplicaLocation{SegmentId: "1", Size: 100}}}}},
		{"move start without target", &storepb.JournalRecord{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{Id: 1, Key: "k"}}}},
		{"empty record", &storepb.JournalRecord{}},
	}
	for _, c := range cases {
		assert.ErrorIs(t, newState().apply(c.rec), ErrBadRecord, c.name)
	}
	// A striped replica must be what a leader writes: pieces that make up
	// the whole, without stripes of their own.
	mount := &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "a", Segment: seg("1", 0, 1<<20)}}}
	for name, l := range map[string]*storepb.ReplicaLocation{
		"short": {SegmentId: "1", Size: 100, Stripes: []*storepb.ReplicaLocation{{SegmentId: "1", Size: 60}}},
		"nested": {SegmentId: "1", Size: 100, Stripes: []*storepb.ReplicaLocation{{SegmentId: "1", Size: 100,
			Stripes: []*storepb.ReplicaLocation{{SegmentId: "1", Size: 100}}}}},
		"elsewhere": {SegmentId: "1", Offset: 4096, Size: 100, Stripes: []*storepb.ReplicaLocation{{SegmentId: "1", Size: 100}}},
	} {
		st := newState()
		require.NoError(t, st.apply(mount))
		require.NoError(t, st.apply(&storepb.JournalRecord{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{
			ClientId: "a", Key: "k", Size: 100, Replicas: []*storepb.ReplicaLocation{l}}}}))
		s, _ := newTestService(t, ServiceConfig{})
		assert.ErrorIs(t, s.restore(st), ErrBadRecord, name)
	}
}

// FuzzJournal feeds arbitrary bytes where a new leader reads the journal
// from etcd: decoding, replay and restore must fail cleanly or succeed,
// never panic, and a restored service must allocate without overlaps.
func FuzzJournal(f *testing.F) {
	seedRecs := []*storepb.JournalRecord{
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "a", Segment: seg("1", 4096, 1<<20)}}},
		{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: "k", Size: 100,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 0, Size: 100}}}}},
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "a", Key: "k", Checksum: 1}}},
		{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}},
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "b", Segment: seg("2", 1<<30, 1<<20)}}},
		{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: "s", Size: 200,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 4096, Size: 200, Stripes: []*storepb.ReplicaLocation{
				{SegmentId: "1", Offset: 4096, Size: 120}, {SegmentId: "2", Offset: 0, Size: 80}}}}}}},
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "a", Key: "s", Checksum: 2}}},
		{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{Id: 3, ClientId: "b", Key: "s",
			To: &storepb.ReplicaLocation{SegmentId: "2", Offset: 4096, Size: 200}}}},
		{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{Id: 4, ClientId: "b", Key: "s",
			To: &storepb.ReplicaLocation{SegmentId: "2", Offset: 8192, Size: 200}}}},
		{Op: &storepb.JournalRecord_MoveAbort{MoveAbort: &storepb.JournalMoveAbort{Id: 4}}},
	}
	b, _ := proto.Marshal(&storepb.JournalBatch{FirstSeq: 1, Records: append(seedRecs, fuzzDrainRecs()...)})
	f.Add(b)
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		var batch storepb.JournalBatch
		if proto.Unmarshal(data, &batch) != nil {
			return
		}
		st := newState()
		for _, r := range batch.Records {
			if st.apply(r) != nil {
				return
			}
		}
		checkFuzzRestore(t, st)
	})
}

// fuzzDrainRecs seeds the fuzzers with a slot's commit and drain jobs
// that start, run and end: the records whose replay sets segments'
// statuses and resumes jobs.
func fuzzDrainRecs() []*storepb.JournalRecord {
	slot := slotPrefix + "c/1"
	return []*storepb.JournalRecord{
		{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: slot, Size: 64,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 1 << 16, Size: 64}}}}},
		{Op: &storepb.JournalRecord_Commit{Commit: &storepb.JournalCommit{ClientId: "a", Slot: slot, Key: "c", Checksum: 3}}},
		{Op: &storepb.JournalRecord_Drain{Drain: &storepb.JournalDrain{Id: "j1", Segments: []string{"node-1"},
			Concurrency: 2, CreatedUnixMs: 1, UpdatedUnixMs: 1, SegmentIds: []string{"1"}}}},
		{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{Id: 3, Key: "s", OnlyFrom: true,
			From: &storepb.ReplicaLocation{SegmentId: "1", Offset: 4096, Size: 120},
			To:   &storepb.ReplicaLocation{SegmentId: "2", Offset: 4096, Size: 120}}}},
		{Op: &storepb.JournalRecord_Drain{Drain: &storepb.JournalDrain{Id: "j1", Segments: []string{"node-1"},
			Concurrency: 2, CreatedUnixMs: 1, UpdatedUnixMs: 2, Status: jobRunning, SucceededUnits: 1,
			MigratedBytes: 120, SegmentIds: []string{"1"}}}},
		{Op: &storepb.JournalRecord_Drain{Drain: &storepb.JournalDrain{Id: "j2", Segments: []string{"node-2"},
			Targets: []string{"node-1"}, CreatedUnixMs: 2, UpdatedUnixMs: 3, Status: jobCanceled, SegmentIds: []string{"2"}}}},
	}
}

// checkFuzzRestore restores st into a new Service, which must fail
// cleanly or succeed; a restored one must allocate without overlapping
// what it restored, and step its resumed drain jobs without panicking.
func checkFuzzRestore(t *testing.T, st *state) {
	s, err := NewService(ServiceConfig{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s.restore(st) != nil {
		return
	}
	defer s.stepDrains()
	// Whatever was restored, new allocations never overlap it.
	for _, sg := range s.segList {
		var used []alloc.Span
		for i := range s.shards {
			for _, o := range s.shards[i].objects {
				for _, r := range o.replicas {
					r.pieces(func(p replica) {
						if p.seg == sg {
							used = append(used, alloc.Span{Off: p.off, Size: p.size})
						}
					})
				}
			}
		}
		for _, m := range s.tasks {
			if m.dst.seg == sg {
				used = append(used, alloc.Span{Off: m.dst.off, Size: m.dst.size})
			}
		}
		if off, ok := sg.alloc.Alloc(64); ok && slices.ContainsFunc(used, func(u alloc.Span) bool { return off < u.Off+u.Size && u.Off < off+64 }) {
			t.Fatalf("allocation at %d overlaps a restored replica", off)
		}
	}
}

// FuzzSnapshot feeds arbitrary bytes where a new leader, a standby or a
// restarted master reads a snapshot chunk (the first chunk of a snapshot
// carries segments, moves and drain jobs), followed by records: loading,
// replay and restore must fail cleanly or succeed, never panic.
func FuzzSnapshot(f *testing.F) {
	st := newState()
	for _, r := range append([]*storepb.JournalRecord{
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "a", Segment: seg("1", 4096, 1<<20)}}},
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "b", Segment: seg("2", 1<<30, 1<<20)}}},
		{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: "s", Size: 120,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 4096, Size: 120}}}}},
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "a", Key: "s", Checksum: 2}}},
		{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{Id: 3, ClientId: "b", Key: "s",
			To: &storepb.ReplicaLocation{SegmentId: "2", Offset: 4096, Size: 120}}}},
	}, fuzzDrainRecs()...) {
		if err := st.apply(r); err != nil {
			f.Fatal(err)
		}
	}
	for _, c := range st.chunks(2) {
		b, _ := proto.Marshal(c)
		f.Add(b, []byte(nil))
	}
	after, _ := proto.Marshal(&storepb.JournalBatch{FirstSeq: 1, Records: fuzzDrainRecs()[2:]})
	f.Add([]byte{0x2a, 0x02, 0x0a, 0x00}, after)
	f.Fuzz(func(t *testing.T, chunk, records []byte) {
		var c storepb.SnapshotChunk
		var batch storepb.JournalBatch
		if proto.Unmarshal(chunk, &c) != nil || proto.Unmarshal(records, &batch) != nil {
			return
		}
		st := newState()
		if st.loadChunk(&c) != nil {
			return
		}
		for i, r := range batch.Records {
			if st.applyAfter(r, uint64(i+1), func(string, uint64) bool { return false }) != nil {
				return
			}
		}
		checkFuzzRestore(t, st)
	})
}

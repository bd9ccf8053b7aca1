package master

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// commit is commitSeq for one item of the default tenant.
func commit(s *Service, client, slot, key string, sum uint32) error {
	_, err := s.commitSeq(DefaultTenant, client, slot, key, sum)
	return err
}

// A value written into a reserved slot and committed is the key's object,
// in the slot's space; a key that exists leaves the slot to its client,
// whose next commit may use it; a slot is its client's alone; a repeated
// commit (its answer lost) succeeds again; and a journal replay rebuilds
// the same state, slots in flight included.
func TestPutReserveCommit(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	require.NoError(t, s.MountSegment(t.Context(), "n", seg("1", 1<<20, 1<<20)))
	slots, err := s.PutReserve(t.Context(), DefaultTenant, "a", 4096, 4, nil)
	require.NoError(t, err)
	require.Len(t, slots, 4)
	used := s.Stats().Used
	require.EqualValues(t, 4*4096, used, "slots hold their space")
	for _, sl := range slots {
		require.True(t, isSlot(sl.Slot), sl.Slot)
		ok, err := s.ExistKey(scopeKey(DefaultTenant, sl.Slot))
		require.NoError(t, err)
		require.False(t, ok, "a slot is no readable object")
	}

	recs := len(j.recs)
	require.NoError(t, commit(s, "a", slots[0].Slot, "k0", 11))
	assert.Len(t, j.recs, recs+1, "a commit is one record")
	reps, _, sum, n, err := s.GetReplicaList("k0")
	require.NoError(t, err)
	assert.EqualValues(t, 11, sum)
	assert.EqualValues(t, 4096, n)
	require.Len(t, reps, 1)
	assert.Equal(t, mem(slots[0].Replicas[0]).BufferAddress, mem(reps[0]).BufferAddress, "the object sits in its slot")
	assert.Equal(t, used, s.Stats().Used, "committing moves space, takes none")

	// Repeated: the first answer was lost.
	require.NoError(t, commit(s, "a", slots[0].Slot, "k0", 11))
	// Another client's slot, a slot gone, a slot name for a key.
	assert.ErrorIs(t, commit(s, "b", slots[1].Slot, "x", 1), storepb.ErrInvalidParams)
	assert.ErrorIs(t, commit(s, "a", slots[0].Slot, "x", 1), storepb.ErrObjectNotFound)
	assert.ErrorIs(t, commit(s, "a", "k0", "x", 1), storepb.ErrInvalidParams)
	assert.ErrorIs(t, commit(s, "a", slots[1].Slot, slots[2].Slot, 1), storepb.ErrInvalidParams)

	// Write-once: k0 exists; slot 1 stays a's, and takes another key.
	assert.ErrorIs(t, commit(s, "a", slots[1].Slot, "k0", 12), storepb.ErrObjectAlreadyExists)
	_, _, sum, _, err = s.GetReplicaList("k0")
	require.NoError(t, err)
	assert.EqualValues(t, 11, sum, "k0 kept its value")
	require.NoError(t, commit(s, "a", slots[1].Slot, "k1", 13))
	// A key with another's put in flight is refused too.
	_, err = s.PutStart(t.Context(), "b", "busy", 100, nil)
	require.NoError(t, err)
	assert.ErrorIs(t, commit(s, "a", slots[2].Slot, "busy", 1), storepb.ErrObjectAlreadyExists)
	// Slot 3 is revoked as any put: its space comes back.
	require.NoError(t, s.PutRevoke(t.Context(), "a", scopeKey(DefaultTenant, slots[3].Slot)))

	want := view(s)
	st := newState()
	for i, r := range j.recs {
		require.NoError(t, st.apply(r), "record %d %v", i+1, r)
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st))
	assert.Equal(t, want, view(s2), "the journal replays to the same state")
	// The restored leader takes the commit of a slot reserved before.
	require.NoError(t, commit(s2, "a", slots[2].Slot, "k2", 14))
	_, _, sum, _, err = s2.GetReplicaList("k2")
	require.NoError(t, err)
	assert.EqualValues(t, 14, sum)

	// A slot abandoned is reclaimed as any put in flight.
	clk.Advance(s.cfg.PutStartReleaseTimeout + time.Second)
	assert.Equal(t, 2, s.ReclaimPuts(), "slot 2 and busy")
	assert.ErrorIs(t, commit(s, "a", slots[2].Slot, "k2", 14), storepb.ErrObjectNotFound)
}

// A reserve is bounded as a batch put is (it reserves fewer), and refused
// to a tenant with a quota, whose space no put asked for it would take.
func TestPutReserveLimits(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{MaxBatch: 8, MaxBatchValueBytes: 4 << 20})
	require.NoError(t, s.MountSegment(t.Context(), "n", seg("1", 64<<20, 64<<20)))
	slots, err := s.PutReserve(t.Context(), DefaultTenant, "a", 100, 9, nil)
	require.NoError(t, err)
	assert.Len(t, slots, 8, "no more than max_batch_size")
	slots, err = s.PutReserve(t.Context(), DefaultTenant, "a", 1<<20, 5, nil)
	require.NoError(t, err)
	assert.Len(t, slots, 4, "no more than max_batch_value_size")
	_, err = s.PutReserve(t.Context(), DefaultTenant, "a", 5<<20, 1, nil)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams)
	_, err = s.PutReserve(t.Context(), DefaultTenant, "a", 100, 0, nil)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams)
	// Space for three of five: three slots.
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.MountSegment(t.Context(), "n", seg("1", 1<<20, 1<<20)))
	slots, err = s2.PutReserve(t.Context(), DefaultTenant, "a", 300<<10, 5, nil)
	require.NoError(t, err)
	assert.Len(t, slots, 3)
	require.NoError(t, s.cfg.Tenants.Set("acme", 1<<20))
	_, err = s.PutReserve(t.Context(), "acme", "a", 100, 1, nil)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams)
}

// A commit record without the slot's start, or of another client's slot,
// does not replay.
func TestJournalCommitWithoutSlot(t *testing.T) {
	commitRec := func(client, slot string) *storepb.JournalRecord {
		return &storepb.JournalRecord{Op: &storepb.JournalRecord_Commit{Commit: &storepb.JournalCommit{
			ClientId: client, Slot: slot, Key: "k", Checksum: 1}}}
	}
	st := newState()
	require.ErrorIs(t, st.apply(commitRec("a", "s")), ErrBadRecord)
	require.NoError(t, st.apply(&storepb.JournalRecord{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{
		ClientId: "a", Key: "s", Size: 10}}}))
	require.ErrorIs(t, st.apply(commitRec("b", "s")), ErrBadRecord)
	require.NoError(t, st.apply(commitRec("a", "s")))
	require.Nil(t, st.objects["s"], "the slot is gone")
	require.EqualValues(t, 10, st.objects["k"].GetSize())
	require.Equal(t, "a", st.objects["k"].GetWriter())
}

// A reserve asked again with its nonce (a retry, its first answer lost)
// answers the slots the first made, on this master and on one restored
// from the journal, and reserves no more; slots gone meanwhile (revoked,
// or committed) are not answered again, and when the first is gone the
// retry reserves a whole set again, the slots still in flight where they
// were; another client's nonce, or another length, makes slots of its own.
func TestPutReserveRetryByNonce(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	require.NoError(t, s.MountSegment(t.Context(), "n", seg("1", 1<<20, 1<<20)))
	ctx := t.Context()
	first, err := describedReserve(s, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	require.Len(t, first, 4)
	used := s.Stats().Used
	again, err := describedReserve(s, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	assert.Equal(t, first, again, "the same slots, where they were")
	assert.Equal(t, used, s.Stats().Used, "no space taken twice")

	require.NoError(t, commit(s, "a", first[3].Slot, "k3", 1))
	require.NoError(t, s.PutRevoke(ctx, "a", scopeKey(DefaultTenant, first[2].Slot)))
	used = s.Stats().Used
	again, err = describedReserve(s, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	assert.Equal(t, first[:2], again, "only the slots still in flight")
	assert.Equal(t, used, s.Stats().Used)

	st := newState()
	for i, r := range j.recs {
		require.NoError(t, st.apply(r), "record %d %v", i+1, r)
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st))
	used = s2.Stats().Used
	again, err = describedReserve(s2, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	assert.Equal(t, first[:2], again, "the next leader answers them too")
	assert.Equal(t, used, s2.Stats().Used)

	// The first slot lost (its segment went, or the master reclaimed it):
	// the retry reserves four again, the second where it was.
	require.NoError(t, s2.PutRevoke(ctx, "a", scopeKey(DefaultTenant, first[0].Slot)))
	again, err = describedReserve(s2, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	require.Len(t, again, 4)
	assert.Equal(t, first[1], again[1])
	assert.Equal(t, used+2*4096, s2.Stats().Used, "the second not reserved twice")

	other, err := describedReserve(s, ctx, DefaultTenant, "b", "x1", 4096, 2, nil)
	require.NoError(t, err, "b's nonce names b's slots")
	require.Len(t, other, 2)
	assert.NotEqual(t, first[2].Slot, other[0].Slot)
	longer, err := describedReserve(s, ctx, DefaultTenant, "a", "x2", 8192, 1, nil)
	require.NoError(t, err)
	assert.NotContains(t, []string{first[2].Slot, first[3].Slot}, longer[0].Slot)

	_, err = describedReserve(s, ctx, DefaultTenant, "a", string(make([]byte, maxNonce+1)), 4096, 1, nil)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams)
}

// A retry whose first slot went (its segment, say) while later ones stay
// in flight answers those even when the pool has no room to make the
// first again: they are the client's, not left to the reclaim.
func TestPutReserveRetryAnswersSlotsPastALostFirst(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "n", seg("1", 1<<20, 4*4096)))
	first, err := describedReserve(s, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	require.Len(t, first, 4, "the pool holds exactly four")
	require.NoError(t, s.PutRevoke(ctx, "a", scopeKey(DefaultTenant, first[0].Slot)))
	_, err = s.PutStart(ctx, "b", "other", 4096, nil) // takes the room, not evictable
	require.NoError(t, err)

	again, err := describedReserve(s, ctx, DefaultTenant, "a", "x1", 4096, 4, nil)
	require.NoError(t, err)
	assert.Equal(t, first[1:], again)
	assert.EqualValues(t, 4*4096, s.Stats().Used)
}

// A slot's name and key, built together, are the name and what scopeKey
// makes of it, for the default tenant and another.
func TestSlotKey(t *testing.T) {
	for _, tenant := range []string{DefaultTenant, "", "t1"} {
		name, key := slotKey(tenant, slotPrefix+"abc/", 12345)
		assert.Equal(t, slotPrefix+"abc/12345", name)
		assert.Equal(t, scopeKey(tenant, name), key, "tenant %q", tenant)
		assert.True(t, isSlot(name))
	}
}

// describedReserve is Service.reserve with its slots as the protocol
// describes them, to compare.
func describedReserve(s *Service, ctx context.Context, t, clientID, nonce string, length uint64, count int, cfg *storepb.ReplicateConfig) ([]*storepb.PutSlot, error) {
	slots, err := s.reserve(ctx, t, clientID, nonce, length, count, cfg, false)
	return describeSlots(slots), err
}

// A reserve's slots pack into arrays that say what PutSlot messages say:
// each name is the stem and the index, each replica a segment of the
// table and an address; slots that do not pack are answered one by one.
func TestPackSlots(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "n1", seg("1", 1<<20, 1<<20)))
	require.NoError(t, s.MountSegment(ctx, "n2", seg("2", 1<<30, 1<<20)))
	slots, err := s.reserve(ctx, DefaultTenant, "a", "x1", 4096, 16, &storepb.ReplicateConfig{ReplicaNum: 2}, false)
	require.NoError(t, err)
	require.Len(t, slots, 16)
	p, ok := packSlots(slots, 4096)
	require.True(t, ok)
	assert.EqualValues(t, 2, p.Replicas)
	require.Len(t, p.Segments, 2)
	for i, d := range describeSlots(slots) {
		assert.Equal(t, d.Slot, p.Stem+strconv.FormatUint(p.Index[i], 10))
		require.Len(t, d.Replicas, 2)
		for j, r := range d.Replicas {
			k := i*2 + j
			g := p.Segments[p.Segment[k]]
			m := r.GetMemory()
			assert.Equal(t, m.SegmentName, g.SegmentName)
			assert.Equal(t, m.TransportEndpoint, g.TransportEndpoint)
			assert.Equal(t, m.Medium, g.Medium)
			assert.Equal(t, m.BufferAddress, p.Address[k])
			assert.EqualValues(t, 4096, m.Size)
		}
	}

	_, ok = packSlots(slots, 8192)
	assert.False(t, ok, "replicas of another length")
	_, ok = packSlots(nil, 4096)
	assert.False(t, ok, "no slots")
	other := slices.Clone(slots)
	other[3].stem = "\x00slot/other/"
	_, ok = packSlots(other, 4096)
	assert.False(t, ok, "two stems")
	other = slices.Clone(slots)
	other[5].reps = other[5].reps[:1]
	_, ok = packSlots(other, 4096)
	assert.False(t, ok, "replica counts differ")
	other = slices.Clone(slots)
	r := other[0].reps[0]
	r.stripes = []replica{r, r}
	other[0].reps = []replica{r, other[0].reps[1]}
	_, ok = packSlots(other, 4096)
	assert.False(t, ok, "striped")
	dead := slots[0].reps[0].seg
	dead.dead.Store(true) // as UnmountSegment marks it
	_, ok = packSlots(slots, 4096)
	assert.False(t, ok, "a replica on a segment that went: one by one, which leaves it out")
	assert.Len(t, describeSlots(slots)[0].Replicas, 1)
	dead.dead.Store(false)
}

package client

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func reservePuts(c *Config) { c.ReservePuts = true }

// batch is n keys prefix0.. and values of size bytes, all in one array
// (as a caller's registered buffer), each seeded by its key's number.
func batch(prefix string, from, n, size int) ([]string, [][]byte, []byte) {
	mem := make([]byte, n*size)
	keys, vals := make([]string, n), make([][]byte, n)
	for i := range n {
		keys[i] = fmt.Sprintf("%s%d", prefix, from+i)
		vals[i] = mem[i*size : (i+1)*size]
		copy(vals[i], value(uint64(from+i), size))
	}
	return keys, vals, mem
}

// Batches put by a client without a segment, from one registered buffer,
// into a node over TCP: after the first batch they go into slots reserved
// while the one before was written, their writes coalesced into a few
// engine requests; every value reads back exact from another client, and
// a put of a key that exists succeeds without writing (write-once) and
// leaves its slot to the next put.
//
// The slots come packed (PackedSlots), or one by one as a client that does
// not ask for them packed gets them.
func TestReservedPutsRoundTrip(t *testing.T) {
	for _, packed := range []bool{true, false} {
		t.Run(fmt.Sprintf("packed=%v", packed), func(t *testing.T) { testReservedPutsRoundTrip(t, packed) })
	}
}

func testReservedPutsRoundTrip(t *testing.T, packed bool) {
	addr := startMaster(t, master.ServiceConfig{}).Addr()
	tcp := func(c *Config) { c.EngineConfig = engine.Config{Host: "127.0.0.1", Transport: "tcp"} }
	newClient(t, addr, 16<<20, tcp)
	w := newClient(t, addr, NoSegment, tcp, reservePuts)
	w.slots.unpacked.Store(!packed)
	r := newClient(t, addr, NoSegment, tcp)
	ctx := ctxT(t)

	const n, size = 32, 4096
	var all []string
	want := map[string][]byte{}
	for b := range 4 {
		keys, vals, mem := batch("k", b*n, n, size)
		require.NoError(t, w.RegisterBuffer(mem))
		for i, err := range w.BatchPut(ctx, keys, vals, nil) {
			require.NoError(t, err, keys[i])
		}
		for i, k := range keys {
			want[k] = vals[i]
		}
		all = append(all, keys...)
		if b == 0 {
			// The next batch's slots are reserved in the background.
			require.Eventually(t, func() bool { return w.slotsHeld(size) == slotsAhead*n }, 5*time.Second, time.Millisecond)
		}
	}
	assert.GreaterOrEqual(t, w.slots.used.Load(), uint64(n), "later batches went into slots")
	got, errs := r.BatchGet(ctx, all)
	for i, k := range all {
		require.NoError(t, errs[i], k)
		require.True(t, bytes.Equal(want[k], got[i]), k)
	}

	// Write-once: k0 exists. Its slot is the client's again.
	require.Eventually(t, func() bool { return w.slotsHeld(size) > 0 }, 5*time.Second, time.Millisecond)
	held := w.slotsHeld(size)
	used := w.slots.used.Load()
	require.NoError(t, w.Put(ctx, "k0", value(999, size), nil))
	assert.Equal(t, used, w.slots.used.Load())
	assert.Equal(t, held, w.slotsHeld(size), "the slot came back to the pool")
	v, err := r.Get(ctx, "k0")
	require.NoError(t, err)
	assert.Equal(t, want["k0"], v, "k0 kept its value")
	// With ReportExisting the caller hears of it.
	w.cfg.ReportExisting = true
	assert.ErrorIs(t, w.Put(ctx, "k0", value(999, size), nil), storepb.ErrObjectAlreadyExists)
}

// slotsHeld is how many slots of n bytes the pool holds.
func (c *Client) slotsHeld(n uint64) int {
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	return len(c.slots.free[n])
}

// A slot the master no longer has (it reclaimed it) fails nothing: the
// put goes again the usual way.
func TestReservedPutSlotGone(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	svc, addr := m.Service(), m.Addr()
	newClient(t, addr, 16<<20)
	w := newClient(t, addr, NoSegment, reservePuts)
	ctx := ctxT(t)
	require.NoError(t, w.Put(ctx, "a", value(1, 1000), nil))
	require.Eventually(t, func() bool { return w.slotsHeld(1000) == slotsMin }, 5*time.Second, time.Millisecond)
	w.slots.mu.Lock()
	held := slices.Clone(w.slots.free[1000])
	w.slots.mu.Unlock()
	for _, s := range held {
		// As the master's reclaim of a stale put would (the default
		// tenant's key of a name starting with NUL is escaped).
		require.NoError(t, svc.PutRevoke(ctx, w.id, "\x00\x00"+s.name))
	}
	require.NoError(t, w.Put(ctx, "b", value(2, 1000), nil))
	v, err := w.Get(ctx, "b")
	require.NoError(t, err)
	assert.Equal(t, value(2, 1000), v)
	assert.Zero(t, w.slots.used.Load(), "b's slot was gone")
}

// Puts into slots under the HA journal, through a failover: every put
// acknowledged (its commit durable: one journal wait, group committed with
// the records of the puts beside it) reads back from the new leader, and
// slots reserved from the old leader are committed to the new one (they
// are in the journal as puts in flight).
func TestReservedPutsSurviveFailover(t *testing.T) {
	etcd := etcdtest.Start(t)
	m1 := startHAMaster(t, etcd, 100000)
	m2 := startHAMaster(t, etcd, 100000)
	leader := waitLeader(t, m1, m2)
	haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
	newClient(t, "", 32<<20, haCfg)
	a := newClient(t, "", NoSegment, haCfg, reservePuts)
	b := newClient(t, "", NoSegment, haCfg)
	ctx := ctxT(t)

	const n, size = 8, 2000
	var (
		mu    sync.Mutex
		acked []string
		want  = map[string][]byte{}
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	// Three writers at once, so that the journal commits their records
	// in common batches.
	for g := range 3 {
		wg.Go(func() {
			for i := g * n; ; i += 3 * n {
				select {
				case <-stop:
					return
				default:
				}
				keys, vals, _ := batch("F", i, n, size)
				errs := a.BatchPut(ctx, keys, vals, nil)
				mu.Lock()
				for j, err := range errs {
					if err == nil {
						acked = append(acked, keys[j])
						want[keys[j]] = vals[j]
					}
				}
				mu.Unlock()
			}
		})
	}
	ackedN := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	require.Eventually(t, func() bool { return ackedN() >= 10*n && a.slots.used.Load() >= 5*n },
		10*time.Second, time.Millisecond, "puts into slots acknowledged before the failover")
	require.NoError(t, leader.Close())
	waitLeader(t, m1, m2)
	before, usedBefore := ackedN(), a.slots.used.Load()
	require.Eventually(t, func() bool { return ackedN() >= before+10*n && a.slots.used.Load() > usedBefore },
		15*time.Second, time.Millisecond, "no put into a slot acknowledged by the new leader")
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	got, errs := b.BatchGet(ctx, acked)
	for i, k := range acked {
		require.NoError(t, errs[i], "%s was acknowledged", k)
		require.True(t, bytes.Equal(want[k], got[i]), k)
	}
	t.Logf("%d puts acknowledged across the failover (%d into slots), all readable", len(acked), a.slots.used.Load())
}

// coalesce merges writes that continue one another here and there, and
// only those.
func TestCoalesce(t *testing.T) {
	mem := make([]byte, 64)
	other := make([]byte, 16)
	all := func([]byte) bool { return true }
	w := func(b []byte, seg string, remote uint64) *xfer {
		return &xfer{op: engine.Write, local: b, seg: seg, remote: remote}
	}
	xs := []*xfer{
		w(mem[0:16], "s", 100), w(mem[16:32], "s", 116), w(mem[32:48], "s", 132), // one run
		w(mem[48:64], "s", 200), // a gap there
		w(other, "s", 216),      // another array here
		w(mem[0:16], "t", 232),  // another segment
	}
	out, at := coalesce(xs, all)
	require.Len(t, out, 4)
	assert.Equal(t, []int{0, 0, 0, 1, 2, 3}, at)
	assert.Len(t, out[0].local, 48)
	assert.EqualValues(t, 100, out[0].remote)
	assert.Len(t, xs[0].local, 16, "the caller's write is left as it was")
	assert.Same(t, xs[3], out[1])

	crc := w(mem[16:32], "s", 116)
	crc.crc = true
	out, _ = coalesce([]*xfer{w(mem[0:16], "s", 100), crc}, all)
	assert.Len(t, out, 2, "a checksumming write stays apart")
	out, _ = coalesce(xs[:3], func(b []byte) bool { return len(b) <= 16 })
	assert.Len(t, out, 3, "memory registered value by value stays apart")
}

// A commit the master refuses for the item's own key (over
// max_key_length) fails that put and leaves its slot to the client, which
// gives it back at Close: nothing stays allocated.
func TestReservedPutBadKeyKeepsSlot(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{MaxKeyLen: 16})
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	require.NoError(t, w.Put(ctx, "a", value(1, 1000), nil))
	require.Eventually(t, func() bool { return w.slotsHeld(1000) == slotsMin }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, w.Put(ctx, "a-key-over-sixteen-bytes", value(2, 1000), nil), storepb.ErrInvalidParams)
	assert.Equal(t, slotsMin, w.slotsHeld(1000), "the slot is back in the pool")
	require.NoError(t, w.Close())
	require.NoError(t, m.Service().Remove(ctx, "a", true))
	assert.Zero(t, m.Service().Stats().Used)
}

// A length the master refuses slots of (over max_value_size) is not asked
// for again, and slots of other lengths are still reserved.
func TestReservedPutsAfterRefusedLength(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{MaxValueLen: 8192})
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	assert.ErrorIs(t, w.Put(ctx, "big", value(1, 16384), nil), storepb.ErrInvalidParams)
	w.slots.wg.Wait()
	require.NoError(t, w.Put(ctx, "a", value(2, 1000), nil))
	w.slots.wg.Wait()
	assert.Equal(t, slotsMin, w.slotsHeld(1000))
	w.slots.mu.Lock()
	defer w.slots.mu.Unlock()
	assert.False(t, w.slots.refused[16384].IsZero())
}

// Stale slots of a length no longer put are given back, so that they do
// not hold the budget slots of the lengths put now need.
func TestReservedPutsDropStaleOfOtherLengths(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	newClient(t, m.Addr(), 160<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	const big = 1 << 20
	keys, vals, _ := batch("big", 0, 16, big)
	for i, err := range w.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, keys[i])
	}
	w.slots.wg.Wait()
	require.Equal(t, slotMaxBytes/big, w.slotsHeld(big), "the whole budget in slots of 1 MiB")
	w.slots.mu.Lock()
	for i := range w.slots.free[big] {
		w.slots.free[big][i].at = time.Now().Add(-2 * slotMaxAge)
	}
	w.slots.mu.Unlock()
	for b := range 2 {
		keys, vals, _ := batch("small", b*8, 8, 4096)
		for i, err := range w.BatchPut(ctx, keys, vals, nil) {
			require.NoError(t, err, keys[i])
		}
		w.slots.wg.Wait()
	}
	assert.Zero(t, w.slotsHeld(big))
	assert.EqualValues(t, 8, w.slots.used.Load(), "the second small batch went into slots")
}

// A stale slot behind a younger one (a slot given back goes to the end)
// takes no value: it is revoked when it comes up.
func TestReservedPutsSkipStaleBehindYounger(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	require.NoError(t, w.Put(ctx, "a", value(1, 1000), nil))
	w.slots.wg.Wait()
	w.slots.mu.Lock()
	free := w.slots.free[1000]
	require.Len(t, free, slotsMin)
	for i := 1; i < len(free); i++ {
		free[i].at = time.Now().Add(-2 * slotMaxAge)
	}
	w.slots.mu.Unlock()
	keys, vals, _ := batch("b", 0, 2, 1000)
	for i, err := range w.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, keys[i])
	}
	assert.EqualValues(t, 1, w.slots.used.Load(), "only the young slot took a value")
	for i, k := range keys {
		v, err := w.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, vals[i], v)
	}
}

// A reserve answered packed unpacks into the slots the same reserve,
// asked again with its nonce, answers one by one: names, segments,
// addresses, sizes and statuses.
func TestUnpackSlotsMatchesSlots(t *testing.T) {
	addr := startMaster(t, master.ServiceConfig{}).Addr()
	newClient(t, addr, 16<<20)
	newClient(t, addr, 16<<20) // two segments: replicas in both
	w := newClient(t, addr, NoSegment)
	ctx := ctxT(t)
	const n, k = 4096, 24
	rc := &storepb.ReplicateConfig{ReplicaNum: 2}
	ask := func(packed bool) *storepb.PutReserveResponse {
		var resp *storepb.PutReserveResponse
		require.NoError(t, w.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
			resp, err = rpc.PutReserve(ctx, &storepb.PutReserveRequest{ClientId: w.id, ValueLength: n, Count: k,
				Config: rc, Nonce: "n1", Packed: packed})
			return err
		}))
		require.NoError(t, resp.Result.AsError())
		return resp
	}
	packed, plain := ask(true), ask(false)
	require.NotNil(t, packed.Packed)
	require.Empty(t, packed.Slots)
	require.Len(t, plain.Slots, k)
	assert.Len(t, packed.Packed.Segments, 2)
	got, err := unpackSlots(packed.Packed, n, k, 2, time.Now())
	require.NoError(t, err)
	require.Len(t, got, k)
	for i, s := range plain.Slots {
		assert.Equal(t, s.Slot, got[i].name)
		require.Len(t, got[i].reps, 2)
		for j, r := range s.Replicas {
			assert.True(t, proto.Equal(r, got[i].reps[j]), "slot %d replica %d: %v, unpacked %v", i, j, r, got[i].reps[j])
		}
	}
}

// A packed answer that does not add up is refused whole.
func TestUnpackSlotsMalformed(t *testing.T) {
	seg := &storepb.MemoryReplica{SegmentName: "s", TransportEndpoint: "h:1"}
	good := func() *storepb.PackedSlots {
		return &storepb.PackedSlots{Stem: "\x00slot/x/", Index: []uint64{0, 1}, Replicas: 1,
			Segments: []*storepb.MemoryReplica{seg}, Segment: []uint32{0, 0}, Address: []uint64{4096, 8192}}
	}
	got, err := unpackSlots(good(), 4096, 2, 1, time.Now())
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "\x00slot/x/1", got[1].name)
	assert.EqualValues(t, 8192, got[1].reps[0].GetMemory().GetBufferAddress())
	for name, bad := range map[string]func(p *storepb.PackedSlots){
		"more slots than asked": func(p *storepb.PackedSlots) { p.Index = []uint64{0, 1, 2} },
		"no slots":              func(p *storepb.PackedSlots) { p.Index = nil },
		"no replicas":           func(p *storepb.PackedSlots) { p.Replicas = 0 },
		"replicas overflow":     func(p *storepb.PackedSlots) { p.Replicas = 1 << 31 },
		"more replicas than asked": func(p *storepb.PackedSlots) {
			p.Replicas, p.Segment, p.Address = 2, []uint32{0, 0, 0, 0}, []uint64{1, 2, 3, 4}
		},
		"addresses short":      func(p *storepb.PackedSlots) { p.Address = p.Address[:1] },
		"segments short":       func(p *storepb.PackedSlots) { p.Segment = p.Segment[:1] },
		"segment out of range": func(p *storepb.PackedSlots) { p.Segment[1] = 1 },
		"segment nil":          func(p *storepb.PackedSlots) { p.Segments[0] = nil },
	} {
		p := good()
		p.Segments = slices.Clone(p.Segments)
		bad(p)
		_, err := unpackSlots(p, 4096, 2, 1, time.Now())
		assert.Error(t, err, name)
	}
	assert.Equal(t, []string{"\x00slot/x/0", "\x00slot/x/1"}, packedNames(good(), 2), "names to revoke")
	assert.Nil(t, packedNames(good(), 1), "more names than asked: none")
}

// Any bytes a master may answer: unpacked or refused, never a panic, and
// what unpacks is whole.
func FuzzUnpackSlots(f *testing.F) {
	seed, _ := proto.Marshal(&storepb.PackedSlots{Stem: "s/", Index: []uint64{0, 7}, Replicas: 1,
		Segments: []*storepb.MemoryReplica{{SegmentName: "a"}}, Segment: []uint32{0, 0}, Address: []uint64{1, 2}})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p storepb.PackedSlots
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		got, err := unpackSlots(&p, 4096, 64, 4, time.Now())
		if err != nil {
			return
		}
		if len(got) != len(p.Index) {
			t.Fatalf("%d slots of %d", len(got), len(p.Index))
		}
		for _, s := range got {
			if len(s.reps) != int(p.Replicas) {
				t.Fatalf("%d replicas, want %d", len(s.reps), p.Replicas)
			}
			for _, r := range s.reps {
				if m := r.GetMemory(); m == nil || m.Size != 4096 {
					t.Fatalf("replica %v", r)
				}
			}
		}
	})
}

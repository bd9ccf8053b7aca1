package client

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
)

// Without ReservePuts a client takes slots for small values it puts again
// and again: none for a length put once, one after the second put of it,
// which the third put commits into, and more per reserve as more puts come
// (half those of the last slotMaxAge); none for values over
// autoSlotMaxLen; at most autoSlotBytes in all, and no more per reserve
// than 1/64 of the pool. Every value reads back.
func TestAutoSlots(t *testing.T) {
	m := startAdminMaster(t)
	newClient(t, m.Addr(), 64<<20)
	w := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	put := func(key string, seed uint64, n int) {
		t.Helper()
		require.NoError(t, w.Put(ctx, key, value(seed, n), nil))
		w.slots.wg.Wait()
	}
	const small = 4096
	put("a", 1, small)
	assert.Zero(t, w.slotsHeld(small), "a length put once reserves nothing")
	put("b", 2, small)
	assert.Equal(t, 1, w.slotsHeld(small), "the second put of a length reserves")
	assert.Equal(t, 1, masterCounter(t, m, "master_put_reserve_requests_total"))
	put("c", 3, small)
	assert.EqualValues(t, 1, w.slots.used.Load(), "the third put went into a slot")
	// A writer putting on: reserves grow with the puts seen.
	for i := range 30 {
		put(fmt.Sprintf("r%d", i), uint64(100+i), small)
	}
	assert.GreaterOrEqual(t, w.slots.used.Load(), uint64(25), "most puts went into slots")
	assert.LessOrEqual(t, masterCounter(t, m, "master_put_reserve_requests_total"), 12, "reserves grew")
	assert.GreaterOrEqual(t, masterCounter(t, m, "master_value_size_bytes_count"), 33, "values put into slots are counted")

	const big = autoSlotMaxLen + 1
	put("big0", 4, big)
	put("big1", 5, big)
	put("big2", 6, big)
	assert.Zero(t, w.slotsHeld(big), "no slots for values over autoSlotMaxLen")

	// One batch of 128 x 64 KiB reserves nothing (a burst now and then);
	// the next asks for slotsAhead batches' worth, and gets what
	// autoSlotBytes leaves and the master's bound allows.
	keys, vals, _ := batch("m", 0, 128, autoSlotMaxLen)
	for i, err := range w.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, keys[i])
	}
	w.slots.wg.Wait()
	assert.Zero(t, w.slotsHeld(autoSlotMaxLen))
	keys, vals, _ = batch("m", 128, 128, autoSlotMaxLen)
	for i, err := range w.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, keys[i])
	}
	w.slots.wg.Wait()
	held := w.slotsHeld(small)*small + w.slotsHeld(autoSlotMaxLen)*autoSlotMaxLen
	assert.Positive(t, w.slotsHeld(autoSlotMaxLen))
	assert.LessOrEqual(t, held, autoSlotBytes)
	// 1/64 of the 64 MiB pool per reserve: 16 slots of 64 KiB.
	assert.LessOrEqual(t, w.slotsHeld(autoSlotMaxLen), 16)

	for i, k := range keys {
		v, err := w.Get(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, vals[i], v, k)
	}
	for i, k := range []string{"a", "b", "c"} {
		v, err := w.Get(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, value(uint64(i+1), small), v, k)
	}
}

// Slots of a length that went unused are given back stale, and the length
// is counted again: one more put of it reserves nothing, the next does.
func TestAutoSlotsCountAgainAfterStale(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	for i := range 2 {
		require.NoError(t, w.Put(ctx, string(rune('a'+i)), value(uint64(i), 1000), nil))
	}
	w.slots.wg.Wait()
	require.Equal(t, 1, w.slotsHeld(1000))
	w.slots.mu.Lock()
	for i := range w.slots.free[1000] {
		w.slots.free[1000][i].at = time.Now().Add(-2 * slotMaxAge)
	}
	w.slots.mu.Unlock()
	w.revokeStale(ctx)
	require.Zero(t, w.slotsHeld(1000))

	require.NoError(t, w.Put(ctx, "c", value(3, 1000), nil))
	w.slots.wg.Wait()
	assert.Zero(t, w.slotsHeld(1000), "the first put after the stale slots reserves nothing")
	require.NoError(t, w.Put(ctx, "d", value(4, 1000), nil))
	w.slots.wg.Wait()
	assert.Equal(t, 1, w.slotsHeld(1000))
	assert.Zero(t, w.slots.used.Load())
}

// NoAutoSlots: every put starts on the master.
func TestNoAutoSlots(t *testing.T) {
	m := startAdminMaster(t)
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.NoAutoSlots = true })
	ctx := ctxT(t)
	keys, vals, _ := batch("k", 0, 64, 4096)
	for range 3 {
		for i, err := range w.BatchPut(ctx, keys, vals, nil) {
			require.NoError(t, err, keys[i])
		}
		w.slots.wg.Wait()
	}
	assert.Zero(t, w.slotsHeld(4096))
	assert.Zero(t, w.slots.used.Load())
	assert.Zero(t, masterCounter(t, m, "master_put_reserve_requests_total"))
}

// startAdminMaster starts a master with its admin port, for its metrics.
func startAdminMaster(t *testing.T) *master.Server {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// MC_STORE_AUTO_SLOTS=0 turns them off as NoAutoSlots does.
func TestAutoSlotsEnvOff(t *testing.T) {
	t.Setenv("MC_STORE_AUTO_SLOTS", "0")
	m := startMaster(t, master.ServiceConfig{})
	newClient(t, m.Addr(), 16<<20)
	w := newClient(t, m.Addr(), NoSegment)
	assert.True(t, w.cfg.NoAutoSlots)
	keys, vals, _ := batch("k", 0, 8, 4096)
	for range 2 {
		for i, err := range w.BatchPut(ctxT(t), keys, vals, nil) {
			require.NoError(t, err, keys[i])
		}
		w.slots.wg.Wait()
	}
	assert.Zero(t, w.slotsHeld(4096))
}

// In a pool too small for a slot within 1/64 of it, the master refuses
// the bounded reserve: the objects put stay (a reserve would evict them),
// and the length is not asked for again for refuseFor.
func TestAutoSlotsSmallPool(t *testing.T) {
	m := startAdminMaster(t)
	newClient(t, m.Addr(), 1<<20)
	w := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	const n = 64 << 10
	for i := range 4 {
		require.NoError(t, w.Put(ctx, fmt.Sprintf("k%d", i), value(uint64(i), n), nil))
		w.slots.wg.Wait()
	}
	assert.Zero(t, w.slotsHeld(n))
	assert.Equal(t, 1, masterCounter(t, m, "master_put_reserve_requests_total"), "refused once, not asked again")
	w.slots.mu.Lock()
	assert.False(t, w.slots.refused[n].IsZero())
	w.slots.mu.Unlock()
	for i := range 4 {
		v, err := w.Get(ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		require.Equal(t, value(uint64(i), n), v)
	}
	// A length 1/64 of the pool holds: slots, so the refusal was the size.
	for i := range 2 {
		require.NoError(t, w.Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), 4096), nil))
		w.slots.wg.Wait()
	}
	assert.Positive(t, w.slotsHeld(4096))
}

// A client that closes while a reserve is on the wire leaves no slot on
// the master: Close lets the reserve end, then gives its slots back.
func TestAutoSlotsNoneLeftAtClose(t *testing.T) {
	m := startAdminMaster(t)
	newClient(t, m.Addr(), 64<<20)
	for i := range 20 {
		w := newClient(t, m.Addr(), NoSegment)
		for j := range 2 {
			require.NoError(t, w.Put(ctxT(t), fmt.Sprintf("c%d/%d", i, j), value(uint64(j), 4096), nil))
		}
		require.NoError(t, w.Close()) // the reserve the second put started may run
	}
	st := m.Service().Stats()
	assert.Equal(t, uint64(40*4096), st.Used, "only the objects put hold space: %d slots left", (int64(st.Used)-40*4096)/4096)
}

// The auto policy on a clock of its own: bursts further apart than
// slotMaxAge never get slots (they would go stale); closer ones do from
// the second; a steady writer's allowance follows its rate across the
// windows' turns instead of falling to one batch; a length whose slots
// went unused starts over.
func TestAutoSlotsPolicy(t *testing.T) {
	var p slotPool
	p.init(t.Context(), true)
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	for i := range 4 {
		assert.Zero(t, p.wants(4096, 64, at(time.Duration(i)*(slotMaxAge+time.Second))), "burst %d", i)
	}
	assert.Zero(t, p.wants(1000, 64, at(0)))
	assert.Equal(t, 64, p.wants(1000, 64, at(4*time.Second)), "a second burst within slotMaxAge")

	// 128 values every 100 ms: 1280 a second.
	var before, after int
	for i := range 120 {
		d := time.Duration(i) * 100 * time.Millisecond
		w := p.wants(512, 128, at(d))
		if i > 0 {
			assert.Positive(t, w, "at %v", d)
		}
		switch d {
		case 4900 * time.Millisecond:
			before = w
		case 5200 * time.Millisecond:
			after = w
		}
	}
	assert.Greater(t, before, 128*10)
	assert.Greater(t, after, before/2, "the window's turn keeps most of the allowance")

	p.unused(1000)
	assert.Zero(t, p.wants(1000, 1, at(5*time.Second)), "unused: starts over")
	assert.Equal(t, 1, p.wants(1000, 1, at(6*time.Second)))

	var all slotPool
	all.init(t.Context(), false)
	assert.Equal(t, math.MaxInt, all.wants(1<<30, 1, at(0)), "ReservePuts: every length, every time")
}

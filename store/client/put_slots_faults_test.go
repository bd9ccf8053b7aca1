package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// reserving reports whether a reserve is in flight.
func (c *Client) reserving() bool {
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	for _, f := range c.slots.filling {
		if f {
			return true
		}
	}
	return false
}

// restartSize is the values' size in the tests of a master's restart.
const restartSize = 4096

// slotsBeforeRestart starts a master (*m, closed when the test ends, as
// whichever master *m then is), a storage node and a reader pinging every
// 20 ms, and a writer pinging every writerPing that holds slotsMin slots
// of restartSize bytes; it returns the master's address, the writer and
// the reader.
func slotsBeforeRestart(t *testing.T, m **master.Server, writerPing time.Duration) (string, *Client, *Client) {
	t.Helper()
	var err error
	*m, err = master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = (*m).Close() })
	addr := (*m).Addr()
	ping := func(c *Config) { c.PingInterval = 20 * time.Millisecond }
	newClient(t, addr, 16<<20, ping)
	w := newClient(t, addr, NoSegment, reservePuts, func(c *Config) { c.PingInterval = writerPing })
	r := newClient(t, addr, NoSegment, ping)
	require.NoError(t, w.Put(ctxT(t), "a", value(1, restartSize), nil))
	require.Eventually(t, func() bool { return w.slotsHeld(restartSize) == slotsMin }, 5*time.Second, time.Millisecond)
	return addr, w, r
}

// A master restarted without a journal knows no slot of its predecessor,
// and gives their space to new puts once the segments are mounted again.
// A client must not write a value into a slot reserved from the old master:
// it would overwrite an object put since on the new one.
func TestReservedSlotsNotWrittenAfterMasterRestart(t *testing.T) {
	var m *master.Server
	addr, w, r := slotsBeforeRestart(t, &m, 20*time.Millisecond)
	ctx := ctxT(t)
	const size = restartSize

	// The master restarts, empty, at the same address; the node mounts
	// its segment again and another client fills it from its start.
	require.NoError(t, m.Close())
	// The master's hold of remounted segments off: what this checks is
	// the client's own part, dropping its slots when told to remount.
	m, err := master.Start(master.ServerConfig{Listen: addr, Service: master.ServiceConfig{RemountHold: -1}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Service().Stats().Segments == 1 }, 5*time.Second, time.Millisecond)
	// The writer hears of the restart at its next ping, and drops its
	// slots (else it could still write into them meanwhile: that window
	// is the master's hold's to close, TestRemountHoldOutlivesOldSlots).
	require.Eventually(t, func() bool { return w.slotsHeld(size) == 0 }, 5*time.Second, time.Millisecond)
	keys, vals, _ := batch("x", 0, slotsMin+1, size)
	for i, err := range r.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, keys[i])
	}

	// The writer puts on, into what it holds as slots.
	for i := range slotsMin {
		require.NoError(t, w.Put(ctx, fmt.Sprintf("y%d", i), value(uint64(1000+i), size), nil))
	}
	got, errs := r.BatchGet(ctx, keys)
	for i, k := range keys {
		require.NoError(t, errs[i], k)
		require.True(t, bytes.Equal(vals[i], got[i]), "%s was overwritten by a write into a slot of the old master", k)
	}
}

// A client that does not hear of the restart (its pings far apart, or
// failing) may use the slots it holds until they reach slotMaxAge. The new
// master holds the segment mounted again for RemountHold, which outlasts
// what is left of their life (by default twice slotMaxAge), so their space
// goes to nobody else before they are unusable. Without the hold (the
// negative control) an object put on the new master is overwritten.
func TestRemountHoldOutlivesOldSlots(t *testing.T) {
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprint("hold=", hold), func(t *testing.T) {
			var m *master.Server
			addr, w, r := slotsBeforeRestart(t, &m, time.Hour) // the writer never pings
			ctx := ctxT(t)
			const size = restartSize
			// Three seconds of life left in each slot, and a hold of four:
			// as the default hold outlasts a whole slot's life.
			w.slots.mu.Lock()
			for i := range w.slots.free[size] {
				w.slots.free[size][i].at = time.Now().Add(3*time.Second - slotMaxAge)
			}
			w.slots.mu.Unlock()
			cfg := master.ServiceConfig{RemountHold: 4 * time.Second}
			if !hold {
				cfg.RemountHold = -1
			}

			require.NoError(t, m.Close())
			m, err := master.Start(master.ServerConfig{Listen: addr, Service: cfg})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return m.Service().Stats().Segments == 1 }, 5*time.Second, time.Millisecond)
			// Another client puts as soon as the master takes its values.
			keys, vals, _ := batch("x", 0, slotsMin+1, size)
			start := time.Now()
			require.Eventually(t, func() bool {
				for i, err := range r.BatchPut(ctx, keys, vals, nil) {
					if err != nil && !errors.Is(err, storepb.ErrObjectAlreadyExists) {
						require.ErrorIs(t, err, storepb.ErrNoAvailableHandle, keys[i])
						return false
					}
				}
				return true
			}, 10*time.Second, 10*time.Millisecond)
			if hold {
				assert.GreaterOrEqual(t, time.Since(start), 3*time.Second, "the puts waited for the hold")
			}

			// The writer puts on, into what it holds as slots.
			for i := range slotsMin {
				require.NoError(t, w.Put(ctx, fmt.Sprintf("y%d", i), value(uint64(1000+i), size), nil))
			}
			got, errs := r.BatchGet(ctx, keys)
			intact := 0
			for i := range keys {
				if errs[i] == nil && bytes.Equal(vals[i], got[i]) {
					intact++
				}
			}
			if hold {
				assert.Equal(t, len(keys), intact, "an object was overwritten by a write into a slot of the old master")
			} else {
				assert.Less(t, intact, len(keys), "without the hold the old slots' writes land on the new objects")
			}
		})
	}
}

// Slots are puts in flight, which a drain waits for. A writer that stops
// putting must not hold a drain of the segment its slots sit on until the
// master reclaims them (PutStartReleaseTimeout, 10 minutes): past
// slotMaxAge the slots can take no value, and should be given back.
func TestReservedIdleSlotsDoNotBlockDrain(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	a := newClient(t, m.Addr(), 8<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	base := "http://" + m.AdminAddr()
	require.NoError(t, w.Put(ctx, "x", value(1, 1000), nil))
	require.Eventually(t, func() bool { return w.slotsHeld(1000) == slotsMin }, 5*time.Second, time.Millisecond)
	b := newClient(t, m.Addr(), 8<<20)

	code, ans := adminJSON(t, "POST", base+"/api/v1/drain_jobs",
		fmt.Sprintf(`{"segments":[%q],"target_segments":[%q]}`, a.SegmentName(), b.SegmentName()))
	require.Equal(t, 200, code, ans)
	job := waitJob(t, base, ans["job_id"].(string)) // 20 s, four times slotMaxAge
	assert.Equal(t, "SUCCEEDED", job["status_name"], job)
}

// Slots held by a writer that stopped putting are space nobody can use:
// eviction does not take puts in flight. Once they are past slotMaxAge
// (useless to the writer) the space must come back without waiting for
// the master's reclaim (PutStartReleaseTimeout, 10 minutes) or for the
// writer's next put.
func TestReservedIdleSlotsGiveSpaceBack(t *testing.T) {
	addr := startMaster(t, master.ServiceConfig{}).Addr()
	newClient(t, addr, 96<<10)
	w := newClient(t, addr, NoSegment, reservePuts)
	r := newClient(t, addr, NoSegment)
	ctx := ctxT(t)
	require.NoError(t, w.Put(ctx, "x", value(1, 4096), nil))
	require.Eventually(t, func() bool { return !w.reserving() && w.slotsHeld(4096) > 0 }, 5*time.Second, time.Millisecond)
	w.slots.mu.Lock()
	for i := range w.slots.free[4096] {
		w.slots.free[4096][i].at = time.Now().Add(-2 * slotMaxAge)
	}
	w.slots.mu.Unlock()
	assert.Eventually(t, func() bool { return r.Put(ctx, "y", value(2, 40<<10), nil) == nil }, 5*time.Second, 50*time.Millisecond,
		"the segment stays full of slots the writer can no longer use")
}

// A writer's reserve runs beside its own put: it must not take the space
// that put needs. On a node with room for the put and a few slots, a put
// that succeeds without slots succeeds with them.
func TestReserveDoesNotStarveOwnPut(t *testing.T) {
	for i := range 20 {
		addr := startMaster(t, master.ServiceConfig{}).Addr()
		newClient(t, addr, 64<<10)
		w := newClient(t, addr, NoSegment, reservePuts)
		require.NoError(t, w.Put(ctxT(t), "x", value(1, 4096), nil), "round %d", i)
	}
}

// lostReserveFixture starts a master, a storage node and a writer that
// reaches the master through a proxy and pings every ping, and makes one
// reserve of 16 slots whose answer the proxy holds past the writer's RPC
// timeout. It returns the writer, the proxy and the master's use of its
// pool before the reserve, with a function reading it now.
func lostReserveFixture(t *testing.T, ping time.Duration) (w *Client, proxy *nettest.Proxy, before uint64, used func() uint64) {
	t.Helper()
	m := startMaster(t, master.ServiceConfig{})
	newClient(t, m.Addr(), 16<<20)
	proxy = nettest.NewProxy(t, m.Addr())
	w = newClient(t, proxy.Addr(), NoSegment, reservePuts, func(c *Config) {
		c.RPCTimeout, c.PingInterval = 300*time.Millisecond, ping
	})
	used = func() uint64 { return m.Service().Stats().Used }
	before = used()

	const k = 16
	p := &w.slots
	p.mu.Lock()
	p.filling[restartSize], p.bytes = true, p.bytes+k*restartSize
	p.wg.Add(1)
	p.mu.Unlock()
	release := proxy.HoldAnswers()
	defer release()
	w.reserve(p.ctx, nil, restartSize, k)
	require.Zero(t, w.slotsHeld(restartSize), "the reserve had no answer")
	require.Len(t, p.lostNow(), 1, "kept to ask again")
	require.Eventually(t, func() bool { return used() == before+k*restartSize }, 5*time.Second, time.Millisecond,
		"the master made the slots")
	return w, proxy, before, used
}

// A reserve whose answer does not come within the RPC timeout leaves the
// slots the master made, which no put takes: the client asks again under
// the same nonce once the master answers its pings, and gives them back,
// rather than leaving the master to hold them until PutStartReleaseTimeout
// (10 minutes). Close does the same for those still without an answer.
func TestLostReserveGivesSlotsBack(t *testing.T) {
	t.Run("heartbeat", func(t *testing.T) {
		w, _, before, used := lostReserveFixture(t, 50*time.Millisecond)
		require.Eventually(t, func() bool { return used() == before }, 5*time.Second, 10*time.Millisecond,
			"the slots of the lost answer given back")
		assert.Empty(t, w.slots.lostNow())
		// Puts take slots again as before.
		require.NoError(t, w.Put(ctxT(t), "after", value(2, restartSize), nil))
		require.Eventually(t, func() bool { return w.slotsHeld(restartSize) > 0 }, 5*time.Second, time.Millisecond)
	})
	t.Run("close", func(t *testing.T) {
		w, _, before, used := lostReserveFixture(t, time.Hour) // no ping: only Close gives them back
		require.NoError(t, w.Close())
		assert.Equal(t, before, used(), "the slots of the lost answer given back")
	})
	t.Run("close during a give-back", func(t *testing.T) {
		// The give-back's own answer held: Close stops it, tries once
		// more itself and returns within its bounds.
		w, proxy, before, used := lostReserveFixture(t, time.Hour)
		release := proxy.HoldAnswers()
		defer release()
		w.giveBackLost(w.slots.ctx)
		start := time.Now()
		require.NoError(t, w.Close())
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.Greater(t, used(), before, "still without an answer: the master reclaims them")
	})
}

// lostNow is the reserves kept without an answer.
func (p *slotPool) lostNow() []lostReserve {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lost)
}

// A reserve call counts as without an answer (its slots may exist) when it
// timed out or its connection failed; not when the master refused it.
func TestReserveUnanswered(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{rpcErr(context.Background(), status.Error(codes.DeadlineExceeded, "late")), true},
		{rpcErr(context.Background(), status.Error(codes.Unavailable, "gone")), true},
		{&storepb.Error{Code: storepb.RPCFail, Err: errNoAnswer}, true},
		{rpcErr(context.Background(), status.Error(codes.Unimplemented, "old master")), false},
		{rpcErr(context.Background(), status.Error(codes.InvalidArgument, "too big")), false},
		{rpcErr(context.Background(), status.Error(codes.PermissionDenied, "no")), false},
		{storepb.ErrInvalidParams, false},
	} {
		assert.Equal(t, c.want, unanswered(c.err), "%v", c.err)
	}
}

// The pool keeps the newest lostMax reserves without an answer, oldest
// first: the oldest are those the master reclaims first.
func TestLostReservesBounded(t *testing.T) {
	var p slotPool
	t0 := time.Now()
	for i := range lostMax + 5 {
		p.noteLost(&storepb.PutReserveRequest{Nonce: fmt.Sprint(i)}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	p.mu.Lock()
	p.keepLost([]lostReserve{{req: &storepb.PutReserveRequest{Nonce: "old"}, at: t0.Add(-time.Hour)}})
	p.mu.Unlock()
	lost := p.lostNow()
	require.Len(t, lost, lostMax)
	assert.Equal(t, "5", lost[0].req.Nonce)
	assert.Equal(t, fmt.Sprint(lostMax+4), lost[lostMax-1].req.Nonce)
}

package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Slots: space for the next puts, reserved while the current ones are
// written. A put of a value with no slot of its length goes the usual way
// (PutStart, write, PutEnd) and asks the master, in the background, for
// as many slots of that length as the batch had items; the next batch of
// that length writes into the slots and commits them (BatchPutCommit):
// one round trip to the master instead of two, and with the HA journal
// one journal wait instead of two. Slots are ordinary puts in flight on
// the master (see store/master/reserve.go), so every invariant of a put
// holds for them; what the client adds is never to use one near the age
// at which the master may reclaim it.
//
// Without Config.ReservePuts a client still uses slots for small values,
// where a put's round trips to the master are most of its time: values of
// at most autoSlotMaxLen bytes, from its second put (or batch put) of that
// length within slotMaxAge of the one before (a client that puts a value
// of some length now and then, or in bursts further apart, reserves
// nothing for it), within autoSlotBytes, and as many as half its puts of
// that length in about the last slotMaxAge (at least the batch), so that a
// slow writer's slots are used before they are stale. Those reserves are
// bounded (PutReserveRequest.bounded): the master answers no more than a
// small share of its pool holds. A length whose slots went unused (stale)
// starts over.

const (
	// slotMaxAge is how old a slot may be and still take a value: far
	// below the master's PutStartReleaseTimeout (10 minutes by default),
	// after which it may give the space to another put.
	slotMaxAge = 5 * time.Second
	// slotMaxBytes bounds the space one client holds in slots.
	slotMaxBytes = 64 << 20
	// slotsAhead is how many batches' worth of slots a reserve asks for,
	// and slotsMin the fewest, so that a reserve (one round trip, one
	// journal wait) serves several puts: a client putting one value at a
	// time reserves once every slotsMin puts. Refilled at half, so that
	// four batches still have slots while the reserve runs: with four
	// ahead, one batch of 128 x 4 KiB in ten found none on a busy 2-core
	// machine and went the slow way; with eight, one in a hundred.
	slotsAhead = 8
	slotsMin   = 16

	// autoSlotMaxLen is the longest value that gets slots without
	// ReservePuts: above it a put's bytes, not its round trips, take
	// most of its time, and a batch's slots would hold megabytes.
	autoSlotMaxLen = 64 << 10
	// autoSlotBytes bounds the space a client holds in slots without
	// ReservePuts: slotsAhead batches of 128 x 4 KiB, 64 values of 64 KiB.
	autoSlotBytes = 4 << 20
	// autoSlotLengths bounds the lengths the client counts puts of
	// without ReservePuts; past it those without slots are forgotten.
	autoSlotLengths = 64
	// refuseFor is how long a length the master refused slots of goes
	// without: the refusal may be the pool's size, which nodes change.
	refuseFor = time.Minute
	// lostMax bounds the reserves without an answer a client keeps to ask
	// again, and lostFor how long it keeps one: by then the master has
	// reclaimed what it made (PutStartReleaseTimeout, 10 minutes by
	// default).
	lostMax = 64
	lostFor = 10 * time.Minute
)

// slot is a put the master started under its own name, not yet committed.
type slot struct {
	name string
	reps []*storepb.Replica
	at   time.Time
}

// slotPool holds a client's slots by value length.
type slotPool struct {
	mu      sync.Mutex
	free    map[uint64][]slot
	filling map[uint64]bool      // a reserve of that length is in flight
	refused map[uint64]time.Time // when the master refused slots of that length
	bytes   uint64               // held in free and in flight
	off     atomic.Bool          // the master has no PutReserve
	// unpacked: reserves do not ask for their slots packed, as a client
	// older than PutReserveRequest.packed; set once a packed answer did
	// not add up (and by tests).
	unpacked atomic.Bool
	used     atomic.Uint64   // values committed in slots
	ctx      context.Context // ends at Close
	wg       sync.WaitGroup  // reserves in flight
	// auto: slots for small values only (no ReservePuts), by the puts
	// of each length seen.
	auto bool
	use  map[uint64]*lengthUse
	// lost: reserves whose answer did not come (the call failed, or the
	// client closed, while it was on the wire), oldest first. The master
	// may have made their slots, which no put would take and it would
	// hold until PutStartReleaseTimeout; asked again under the same
	// nonce it answers them, and they are given back (giveBackLost).
	lost       []lostReserve
	recovering bool // a giveBackLost is running
}

// lostReserve is a reserve without an answer, first asked at at.
type lostReserve struct {
	req *storepb.PutReserveRequest
	at  time.Time
}

// lengthUse is what an auto pool saw of the puts of one length: values
// put in windows of slotMaxAge, the current one and the one before.
type lengthUse struct {
	on        bool      // slots are reserved for it
	cur, prev int       // values put in the current window, the one before
	since     time.Time // the current window's start
	last      time.Time // the last put; zero: none since the length started over
}

// slotsFor reports whether a put may use slots: a put (not an upsert) with
// the client's default replication, which the slots were reserved with.
// A tenant's client does without: its tenant may have a quota, which
// slots would take from.
func (c *Client) slotsFor(rc *ReplicateConfig, upsert bool) bool {
	return !upsert && rc == &c.cfg.Replicate && c.cfg.TenantID == "" && !c.slots.off.Load() &&
		(c.cfg.ReservePuts || !c.cfg.NoAutoSlots)
}

// budget is the most space the pool holds in slots.
func (p *slotPool) budget() uint64 {
	if p.auto {
		return autoSlotBytes
	}
	return slotMaxBytes
}

// wants returns how many slots of n bytes the pool may hold after a put
// of k values of that length at now (p.mu held), 0 for none: any number
// with ReservePuts, else for small values put again within slotMaxAge,
// half of those put in about the last slotMaxAge and at least k.
func (p *slotPool) wants(n uint64, k int, now time.Time) int {
	if !p.auto {
		return math.MaxInt
	}
	if n > autoSlotMaxLen {
		return 0
	}
	u := p.use[n]
	if u == nil {
		if len(p.use) >= autoSlotLengths {
			maps.DeleteFunc(p.use, func(_ uint64, u *lengthUse) bool { return !u.on })
			if len(p.use) >= autoSlotLengths {
				clear(p.use)
			}
		}
		u = &lengthUse{since: now}
		p.use[n] = u
	}
	switch age := now.Sub(u.since); {
	case age > 2*slotMaxAge:
		u.cur, u.prev, u.since = 0, 0, now
	case age > slotMaxAge:
		u.cur, u.prev, u.since = 0, u.cur, now
	}
	again := !u.last.IsZero() && now.Sub(u.last) <= slotMaxAge
	u.last = now
	u.cur += k
	if !u.on && !again {
		return 0
	}
	u.on = true
	// The window before, weighed by how much of it is within slotMaxAge.
	left := slotMaxAge - now.Sub(u.since)
	recent := u.cur + int(int64(u.prev)*int64(left)/int64(slotMaxAge))
	return max(k, recent/2)
}

// unused notes that slots of n bytes went stale (p.mu held): the length
// starts over, an auto pool reserving more only from its second put again.
func (p *slotPool) unused(n uint64) {
	if u := p.use[n]; u != nil {
		*u = lengthUse{since: u.since}
	}
}

// takeSlots gives items a slot of their length where the pool has one,
// and returns the items left without. Slots past slotMaxAge are revoked.
func (c *Client) takeSlots(ctx context.Context, items []*putItem) (rest []*putItem) {
	p := &c.slots
	now := time.Now()
	var stale []string
	p.mu.Lock()
	// Of every length: slots of a length no longer put must not hold the
	// budget of those that are. A slot given back (giveBack) may sit
	// behind younger ones: each is checked again when it is taken.
	dropStale := func(n uint64) {
		free := p.free[n]
		for len(free) > 0 && now.Sub(free[0].at) > slotMaxAge {
			stale = append(stale, free[0].name)
			p.bytes -= n
			free = free[1:]
			p.unused(n)
		}
		p.free[n] = free
	}
	for n := range p.free {
		dropStale(n)
	}
	for _, it := range items {
		n := it.size()
		dropStale(n)
		free := p.free[n]
		if len(free) == 0 {
			rest = append(rest, it)
			continue
		}
		s := free[0]
		p.free[n] = free[1:]
		p.bytes -= n
		it.slot, it.slotAt, it.reps, it.started = s.name, s.at, s.reps, true
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		_ = c.revoke(ctx, stale)
	}
	return rest
}

// giveBack returns the slot of an item the master refused to commit for a
// reason of the item's own (its key exists, or is invalid): the slot is
// still the client's, and its bytes are overwritten by the next value.
func (c *Client) giveBack(it *putItem) {
	p := &c.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	n := it.size()
	p.free[n] = append(p.free[n], slot{name: it.slot, reps: it.reps, at: it.slotAt})
	p.bytes += n
}

// refill reserves, in the background, slots for the next batches like
// items (their lengths, as many of each), up to slotsAhead batches' worth
// and at least slotsMin, where the pool has fallen to half of that: the
// reserve then runs while the next batches still have slots, rather than
// after the pool ran dry (a reserve takes the master about as long as a
// batch's commit, and a batch without slots goes the slow way).
func (c *Client) refill(rc *storepb.ReplicateConfig, items []*putItem) {
	p := &c.slots
	want := map[uint64]int{}
	for _, it := range items {
		want[it.size()]++
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil || p.ctx.Err() != nil {
		return
	}
	for n, k := range want {
		// Full is also no more than the budget lets the pool hold: half
		// of a full it can never reach would reserve on every batch.
		most := p.wants(n, k, now)
		if most == 0 {
			continue
		}
		have, room := len(p.free[n]), int((p.budget()-min(p.bytes, p.budget()))/n)
		full := min(max(slotsAhead*k, slotsMin), have+room, most)
		if 2*have >= full {
			continue
		}
		k = full - have
		if k <= 0 || p.filling[n] || now.Sub(p.refused[n]) < refuseFor {
			continue
		}
		p.filling[n] = true
		p.bytes += uint64(k) * n
		p.wg.Add(1)
		go c.reserve(p.ctx, rc, n, k)
	}
}

// reserve asks the master for k slots of n bytes and pools them.
func (c *Client) reserve(ctx context.Context, rc *storepb.ReplicateConfig, n uint64, k int) {
	p := &c.slots
	defer p.wg.Done()
	// The nonce is the same on every retry of the call: one whose answer
	// was lost gets the slots it made rather than more.
	req := &storepb.PutReserveRequest{ClientId: c.id, ValueLength: n, Count: uint32(k), Config: rc,
		Nonce: strconv.FormatUint(rand.Uint64(), 36), Packed: !p.unpacked.Load(), Bounded: p.auto}
	asked := time.Now()
	resp, err := c.askReserve(ctx, req)
	if unanswered(err) {
		p.noteLost(req, asked)
	}
	if err == nil {
		if err = resp.Result.AsError(); err != nil {
			// Slots named beside an error (made, but not durable in
			// time) are not this client's to use: given back.
			if names := answeredNames(resp, k); len(names) > 0 {
				_ = c.revoke(ctx, names)
			}
		}
	}
	now := time.Now()
	var got []slot
	switch {
	case err != nil:
	case resp.Packed != nil:
		if got, err = unpackSlots(resp.Packed, n, k, max(int(rc.GetReplicaNum()), 1), now); err != nil {
			// A master whose packing this client does not read: the
			// slots it made are given back where they can be named, and
			// later reserves ask for them one by one.
			p.unpacked.Store(true)
			if names := packedNames(resp.Packed, k); len(names) > 0 {
				_ = c.revoke(ctx, names)
			}
		}
	default:
		got = make([]slot, len(resp.Slots))
		for i, s := range resp.Slots {
			got[i] = slot{name: s.Slot, reps: s.Replicas, at: now}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if errors.Is(err, storepb.ErrInvalidParams) {
		// The length, or slots for this client: asking again gets the
		// same answer. Puts of that length go the usual way.
		p.refused[n] = now
	}
	p.filling[n] = false
	p.bytes -= uint64(k) * n
	if err != nil {
		return
	}
	p.free[n] = append(p.free[n], got...)
	p.bytes += uint64(len(got)) * n
}

// askReserve makes the reserve call req; an error is the call's, not the
// master's answer (resp.Result).
func (c *Client) askReserve(ctx context.Context, req *storepb.PutReserveRequest) (resp *storepb.PutReserveResponse, err error) {
	err = c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.PutReserve(ctx, req)
		if status.Code(err) == codes.Unimplemented {
			c.slots.off.Store(true) // a master older than slots
		}
		return err
	})
	return resp, err
}

// unanswered reports whether err, a reserve call's, came without the
// master's answer, which may have made the slots: a timeout, or a
// connection that failed. A refusal (an older master without PutReserve,
// a request over its limits, credentials it does not take) made none.
func unanswered(err error) bool {
	switch status.Code(err) {
	case codes.Unimplemented, codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition,
		codes.PermissionDenied, codes.Unauthenticated:
		return false
	}
	return errors.Is(err, storepb.ErrRPCFail) || errors.Is(err, storepb.ErrRPCTimeout)
}

// answeredNames is the names of the slots resp names, of a reserve of at
// most k.
func answeredNames(resp *storepb.PutReserveResponse, k int) []string {
	if resp.GetPacked() != nil {
		return packedNames(resp.Packed, k)
	}
	names := make([]string, 0, len(resp.GetSlots()))
	for _, s := range resp.GetSlots() {
		names = append(names, s.Slot)
	}
	return names
}

// noteLost keeps req, first asked at at, to ask again: its call failed
// without the master's answer.
func (p *slotPool) noteLost(req *storepb.PutReserveRequest, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keepLost([]lostReserve{{req: req, at: at}})
}

// keepLost adds lost to the pool's, the newest lostMax kept: the oldest
// are those the master reclaims first. p.mu is held.
func (p *slotPool) keepLost(lost []lostReserve) {
	p.lost = append(p.lost, lost...)
	slices.SortStableFunc(p.lost, func(a, b lostReserve) int { return a.at.Compare(b.at) })
	if n := len(p.lost) - lostMax; n > 0 {
		p.lost = append(p.lost[:0], p.lost[n:]...)
	}
}

// giveBackLost asks the master again, in the background, for the reserves
// whose answer did not come, each under its nonce, and gives back the
// slots it answers: made when first asked (more than an RPC timeout ago,
// past slotMaxAge) or, where the first call never reached it, made now.
// Those it cannot ask or give back yet are kept for the next time, until
// lostFor. The heartbeat calls it once the master answers; the goroutine
// counts in c.wg, as the heartbeat itself (Close stops and waits for both
// before it gives back what is left).
func (c *Client) giveBackLost(ctx context.Context) {
	p := &c.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lost) == 0 || p.recovering || ctx.Err() != nil {
		return
	}
	lost := p.lost
	p.lost, p.recovering = nil, true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		kept := c.revokeLost(ctx, lost)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.keepLost(kept)
		p.recovering = false
	}()
}

// revokeLost asks each of lost again and revokes the slots answered; it
// returns those it could not ask, or whose slots it could not give back,
// younger than lostFor. (A master whose PutStartReleaseTimeout is above
// lostFor has reclaimed nothing by then: it does later.)
func (c *Client) revokeLost(ctx context.Context, lost []lostReserve) (kept []lostReserve) {
	for _, l := range lost {
		if time.Since(l.at) > lostFor {
			continue
		}
		resp, err := c.askReserve(ctx, l.req)
		if err != nil {
			if unanswered(err) {
				kept = append(kept, l)
			}
			continue
		}
		// One reserve's slots, one revoke: no more than a batch.
		names := answeredNames(resp, int(l.req.Count))
		if len(names) > 0 && slices.ContainsFunc(c.revoke(ctx, names), func(err error) bool {
			return err != nil && !errors.Is(err, storepb.ErrObjectNotFound)
		}) {
			kept = append(kept, l) // asked again, the same nonce names the same slots
		}
	}
	return kept
}

// takeLost empties the reserves without an answer, for Close.
func (p *slotPool) takeLost() []lostReserve {
	p.mu.Lock()
	defer p.mu.Unlock()
	lost := p.lost
	p.lost = nil
	return lost
}

// unpackSlots is the slots of n bytes a reserve of at most k, of reps
// replicas each, answered packed, reserved at at, with their replicas made
// in a few arrays rather than a few allocations each. A packed answer that
// does not add up is an error, nothing of it used.
func unpackSlots(p *storepb.PackedSlots, n uint64, k, reps int, at time.Time) ([]slot, error) {
	ns, r := len(p.GetIndex()), int64(p.GetReplicas())
	switch {
	case ns == 0 || ns > k:
		return nil, fmt.Errorf("store: packed slots: %d slots answer a reserve of %d", ns, k)
	case r <= 0 || r > int64(reps):
		return nil, fmt.Errorf("store: packed slots: %d replicas each, of %d asked", r, reps)
	case int64(len(p.GetSegment())) != int64(ns)*r || int64(len(p.GetAddress())) != int64(ns)*r:
		return nil, fmt.Errorf("store: packed slots: %d slots of %d replicas with %d segments and %d addresses",
			ns, r, len(p.GetSegment()), len(p.GetAddress()))
	}
	for _, g := range p.Segment {
		if int(g) >= len(p.Segments) || p.Segments[g] == nil {
			return nil, fmt.Errorf("store: packed slots: segment %d of %d", g, len(p.Segments))
		}
	}
	return unpacked(p, n, int(r), at), nil
}

// packedNames is the names of the slots of a packed answer to a reserve
// of at most k, when it holds no more.
func packedNames(p *storepb.PackedSlots, k int) []string {
	if len(p.GetIndex()) > k {
		return nil
	}
	names := make([]string, len(p.GetIndex()))
	for i, x := range p.GetIndex() {
		names[i] = p.GetStem() + strconv.FormatUint(x, 10)
	}
	return names
}

// unpacked is the slots of a packed answer unpackSlots checked, of r
// replicas each.
func unpacked(p *storepb.PackedSlots, n uint64, r int, at time.Time) []slot {
	ns := len(p.Index)
	mems := make([]storepb.MemoryReplica, ns*r)
	locs := make([]storepb.Replica_Memory, ns*r)
	reps := make([]storepb.Replica, ns*r)
	ptrs := make([]*storepb.Replica, ns*r)
	out := make([]slot, ns)
	var d [20]byte
	for i := range out {
		for j := range r {
			x := i*r + j
			g, m := p.Segments[p.Segment[x]], &mems[x]
			m.SegmentName, m.TransportEndpoint, m.Medium = g.SegmentName, g.TransportEndpoint, g.Medium
			m.BufferAddress, m.Size = p.Address[x], n
			locs[x].Memory = m
			reps[x].Status, reps[x].Location = storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING, &locs[x]
			ptrs[x] = &reps[x]
		}
		out[i] = slot{name: p.Stem + string(strconv.AppendUint(d[:0], p.Index[i], 10)), reps: ptrs[i*r : (i+1)*r : (i+1)*r], at: at}
	}
	return out
}

// revokeStale gives back the slots past slotMaxAge, of every length: they
// can take no value, and until revoked they hold space that eviction does
// not take and drains wait for (the master reclaims them only after
// PutStartReleaseTimeout). The heartbeat calls it, so a writer that
// stopped putting does not keep them.
func (c *Client) revokeStale(ctx context.Context) {
	p := &c.slots
	now := time.Now()
	var stale []string
	p.mu.Lock()
	for n, free := range p.free {
		kept := free[:0]
		for _, s := range free {
			if now.Sub(s.at) > slotMaxAge {
				stale = append(stale, s.name)
				p.bytes -= n
				p.unused(n)
			} else {
				kept = append(kept, s)
			}
		}
		clear(free[len(kept):])
		p.free[n] = kept
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		_ = c.revoke(ctx, stale)
	}
}

// forgetSlots empties the pool without revoking: the master the slots
// came from is gone (it restarted or another took over without knowing
// this client). A new master that has not replayed them may have given
// their space to other puts, so writing into them could overwrite those.
// The master's side of it: a segment its owner mounts again (told to, as
// here) takes no new replicas for the master's RemountHold, twice
// slotMaxAge, so that a client that has not heard yet cannot reach them
// with a slot either.
func (c *Client) forgetSlots() {
	if n := len(c.dropSlots()); n > 0 {
		c.log.Info("store: slots of a previous master dropped", "slots", n)
	}
}

// dropSlots empties the pool and returns the names of the slots it held,
// for the caller to revoke: after a slot failed, the others may sit on the
// same lost segment.
func (c *Client) dropSlots() []string {
	p := &c.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	var names []string
	for n, free := range p.free {
		for _, s := range free {
			names = append(names, s.name)
		}
		p.bytes -= uint64(len(free)) * n
		delete(p.free, n)
	}
	return names
}

// commit ends the puts written into slots: each slot's space goes to its
// key. A key that exists leaves the slot to the client (write-once: the
// put succeeds without writing, as any put of an existing key). A slot
// the master no longer has (it reclaimed it, or lost its segment) fails
// with ObjectNotFound: the item is put again the usual way.
func (c *Client) commit(ctx context.Context, items []*putItem) (again []*putItem) {
	req := &storepb.BatchPutCommitRequest{ClientId: c.id, Items: make([]*storepb.PutCommitItem, len(items))}
	for i, it := range items {
		req.Items[i] = &storepb.PutCommitItem{Slot: it.slot, Key: it.key, Checksum: it.sum}
	}
	var resp *storepb.BatchResult
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchPutCommit(ctx, req)
		return err
	})
	err = batchErr(err, len(resp.GetResults()), len(items))
	lost, revoke := false, []string(nil)
	for i, it := range items {
		if it.err = err; err == nil {
			it.err = resp.Results[i].AsError()
		}
		switch {
		case it.err == nil:
			c.slots.used.Add(1)
		case errors.Is(it.err, storepb.ErrObjectAlreadyExists):
			c.giveBack(it)
			it.started = false // as a PutStart that found the key
		case errors.Is(it.err, storepb.ErrInvalidParams):
			// The key: the master checks it before it touches the slot.
			c.giveBack(it)
			it.started = false
		case errors.Is(it.err, storepb.ErrObjectNotFound):
			lost = true
			it.slot, it.reps, it.started, it.err = "", nil, false, nil
			again = append(again, it)
		default:
			// The commit failed whole, or its record did: the slot may or
			// may not be committed. Revoked, it is freed if it was not (a
			// committed slot's name is gone, the revoke finds nothing).
			lost = true
			revoke = append(revoke, it.slot)
		}
	}
	if lost {
		revoke = append(revoke, c.dropSlots()...)
	}
	if len(revoke) > 0 {
		_ = c.revoke(ctx, revoke)
	}
	return again
}

// init readies the pool; reserves end with ctx (the client's life).
func (p *slotPool) init(ctx context.Context, auto bool) {
	p.free, p.filling, p.refused, p.ctx = map[uint64][]slot{}, map[uint64]bool{}, map[uint64]time.Time{}, ctx
	p.auto, p.use = auto, map[uint64]*lengthUse{}
}

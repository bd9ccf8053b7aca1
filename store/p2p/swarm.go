package p2p

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errReplaced ends a pass whose object was replaced or deleted under it;
// fetch reads the object again and starts over.
var errReplaced = errors.New("p2p: object replaced during fetch")

const (
	// publishDelay is the longest a landed shard waits to be published;
	// the shards that land meanwhile share its compare-and-swap, so a
	// receiver writes the record a few times a second however small the
	// shards.
	publishDelay = 20 * time.Millisecond
	// publishBatch unpublished shards are published without waiting.
	publishBatch = 4
	// maxClaimBatch is the most shards a receiver claims in one
	// transaction (see claimAheadLocked).
	maxClaimBatch = 32
)

// shardState is where a shard stands in a pass.
type shardState uint8

const (
	todo   shardState = iota // not started
	busy                     // a worker is reading it
	landed                   // here, published or about to be
)

// how is where a picked shard is read from.
type how uint8

const (
	fromPeers how = iota // a replica holder (a seed if all of them fail)
	claimSeed            // a seed, once this pass has claimed it
	fromSeed             // a seed: claimed ahead by this pass, stolen, or nobody else fetches
)

// swarm is one pass of a GetReplica over one version of an object: the
// receiver's schedule of shards, its view of who serves what and of who
// reads what from the seeds, and the shards it holds but has not announced
// or published yet. Workers take shards from it; goroutines follow the
// record and the claim directory in etcd (watches), keep the pass's lease
// alive, and announce and publish landed shards in batches.
type swarm struct {
	s      *Store
	base   *record     // the object as the pass began
	lay    *layout     // where its bytes go here
	starts []uint64    // object offset of each shard
	mine   []*location // this node's copy of each shard; nil where it is split
	order  []int       // the shards by this node's weight for them, heaviest first
	cl     *claims     // this pass's fetcher entry and seed claims

	mu        sync.Mutex
	rec       *record            // the newest record seen, this node left out
	holds     map[string]holding // other receivers' announcements, by key
	view      *record            // rec with holds added
	ownView   bool               // view's shards are its own, not rec's: holdLocked may add to them
	state     []shardState       // per shard
	live      []int              // per shard: replica holders in view not in bad
	claimed   []string           // per shard: who reads it from a seed ("": nobody; this node's name: this pass)
	fetchers  map[string]bool    // the other receivers in a pass over this object
	claimRev  int64              // the claim directory's revision claimed and fetchers are as of
	claimN    int                // how many shards the next claim may ask for (claimAheadLocked)
	claiming  int                // shards claimed ahead in a transaction in flight (state busy meanwhile)
	seeded    bool               // a read of this pass from a seed has landed
	seedBusy  int                // reads from a seed in flight or about to start
	reading   map[string]int     // reads in flight per source segment
	best      map[string]int     // pickLocked's scratch: per replica holder, the rarest shard it has that is todo
	bad       map[string]bool    // segments that failed a read in this pass
	claimedAt []time.Time        // per shard: when this node learnt of another's claim, or the pass began
	readTime  time.Duration      // the shard reads of this pass so far, together
	reads     int                // how many
	annTime   time.Duration      // the announcements of this pass so far, together
	anns      int                // how many
	unpub     []int              // landed shards not yet published, in landing order
	held      []int              // landed shards this node can serve, in landing order
	announced int                // how many of held were announced under the lease of generation annGen
	annGen    int                // claims.gen of the announcements
	wake      chan struct{}      // closed, and replaced, when a worker may pick anew

	kick     chan struct{} // a shard landed: wakes publishLoop
	kickHeld chan struct{} // a shard landed: wakes announceLoop
}

// holding is one announcement of another receiver: its segment, and the
// shards it landed (shard to address).
type holding struct {
	seg string
	at  map[int]uint64
}

func newSwarm(s *Store, r *record, lay *layout) *swarm {
	n := len(r.p.Shards)
	w := &swarm{
		s: s, base: r, lay: lay,
		starts: make([]uint64, n), mine: make([]*location, n), order: make([]int, n),
		state: make([]shardState, n), live: make([]int, n), claimed: make([]string, n), claimedAt: make([]time.Time, n),
		claimN: 1, fetchers: map[string]bool{}, bad: map[string]bool{}, reading: map[string]int{}, best: map[string]int{},
		holds: map[string]holding{},
		wake:  make(chan struct{}), kick: make(chan struct{}, 1), kickHeld: make(chan struct{}, 1),
	}
	// Weights differ from node to node: so do the orders in which they
	// claim shards, and receivers that start together rarely ask for the
	// same one (a lost claim costs a round trip to etcd).
	weight := make([]uint64, n)
	for i := range n {
		w.order[i], weight[i] = i, ownerHash(s.name, i)
	}
	slices.SortFunc(w.order, func(a, b int) int { return cmp.Compare(weight[b], weight[a]) })
	var at uint64
	var buf []piece
	for i, sh := range r.p.Shards {
		w.starts[i] = at
		// A shard split over two local chunks cannot be served by one READ
		// at one address, so this node is never a source of it.
		if buf = lay.pieces(buf[:0], at, sh.Size); len(buf) == 1 {
			w.mine[i] = &location{SegmentName: s.name, Offset: buf[0].local}
		}
		at += sh.Size
	}
	// A shard nobody claimed counts as claimed when the pass began, for
	// patience: one this node cannot serve (so does not claim) is left
	// to the other fetchers that long, at least.
	for i := range w.claimedAt {
		w.claimedAt[i] = time.Now()
	}
	w.install(r)
	return w
}

// pass fetches every shard of r into lay, Config.Concurrency at a time,
// publishing them as they land; the first failure stops the others. It
// returns errReplaced when r stopped being the object on the way.
func (s *Store) pass(ctx context.Context, r *record, lay *layout) error {
	dir := claimDir(r) // before newSwarm strikes this node from r's lists
	w := newSwarm(s, r, lay)
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	// Enter the claim directory first: the others fetching now learn of
	// this receiver before it asks a seed for anything, and it of them.
	mctx, cancel := s.metaCtx(ctx)
	cl, kvs, rev, err := s.meta.join(mctx, r.p.Name, dir, s.name, s.cfg.Timeout)
	cancel()
	if err != nil {
		return err
	}
	defer cl.leave(ctx)
	w.cl = cl
	w.mu.Lock()
	w.resetClaimsLocked(kvs, rev)
	w.mu.Unlock()
	sctx, stopSync := context.WithCancel(ctx)
	var syncer, workers sync.WaitGroup
	syncer.Go(func() { cl.keepAlive(sctx) })
	syncer.Go(func() { w.follow(sctx, abort) })
	syncer.Go(func() { w.followClaims(sctx, rev) })
	syncer.Go(func() { w.publishLoop(sctx, abort) })
	syncer.Go(func() { w.announceLoop(sctx) })
	for range min(s.cfg.Concurrency, len(r.p.Shards)) {
		workers.Go(func() {
			if err := w.work(ctx); err != nil {
				abort(err)
			}
		})
	}
	workers.Wait()
	stopSync()
	syncer.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	// The rest of the shards, and the check that the object is still the
	// one whose bytes arrived.
	return w.publish(ctx)
}

// work fetches shards until none is left to start.
func (w *swarm) work(ctx context.Context) error {
	var wk worker
	for {
		pk, err := w.next(ctx)
		if err != nil || pk.i < 0 {
			return err
		}
		if pk.how == claimSeed {
			if won, err := w.claim(ctx, pk.i); err != nil || !won {
				if err != nil {
					return err
				}
				continue
			}
		}
		wk.pieces = w.lay.pieces(wk.pieces[:0], w.starts[pk.i], w.base.p.Shards[pk.i].Size)
		if err := w.pullShard(ctx, pk, &wk); err != nil {
			return err
		}
		w.land(pk.i)
		if w.s.afterShard != nil {
			w.s.afterShard(pk.i)
		}
	}
}

// claim claims shard i, picked to be read from a seed, for this pass,
// with the shards claimAheadLocked adds in the same transaction; a shard
// someone else claimed first goes back to be picked again, and the seed
// slot taken for i is freed.
func (w *swarm) claim(ctx context.Context, i int) (bool, error) {
	w.mu.Lock()
	batch := w.claimAheadLocked(i)
	w.mu.Unlock()
	if w.s.beforeClaim != nil {
		for _, j := range batch {
			w.s.beforeClaim(j)
		}
	}
	mctx, cancel := w.s.metaCtx(ctx)
	won, holders, err := w.cl.claim(mctx, batch)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	all := err == nil
	for k, j := range batch {
		if k > 0 {
			w.state[j] = todo
		}
		switch {
		case err != nil:
		case won[k]:
			w.claimed[j] = w.s.name
		default:
			all = false
			if holders[k] != "" && w.claimed[j] == "" {
				w.claimed[j], w.claimedAt[j] = holders[k], time.Now()
			}
		}
	}
	w.claiming -= len(batch) - 1
	// Slow start: a receiver alone claims twice as many at a time after
	// each batch it won whole, so one that fetches many small shards
	// spends few round trips on claims; any other receiver fetching, or a
	// claim lost, brings it back to one at a time (claimAheadLocked).
	if all && len(w.fetchers) == 0 {
		w.claimN = min(2*w.claimN, maxClaimBatch)
	} else {
		w.claimN = 1
	}
	w.wakeLocked()
	if err == nil && won[0] {
		return true, nil
	}
	w.state[i] = todo
	w.seedBusy--
	return false, err
}

// claimAheadLocked returns i and the shards to claim with it: up to
// claimN-1 more that this pass would claim next (nobody holds or claimed
// them, and it can serve them), marked busy until the claim is answered.
// Only while no other receiver fetches (nor has, in this pass, since the
// last claim) and a read from a seed has landed: the shards a receiver
// claimed ahead wait for its reads, and others would wait for them.
func (w *swarm) claimAheadLocked(i int) []int {
	batch := []int{i}
	if len(w.fetchers) > 0 || !w.seeded {
		w.claimN = 1
		return batch
	}
	for _, j := range w.order {
		if len(batch) >= w.claimN {
			break
		}
		if j != i && w.state[j] == todo && w.live[j] == 0 && w.claimed[j] == "" && w.mine[j] != nil {
			w.state[j] = busy
			batch = append(batch, j)
		}
	}
	w.claiming += len(batch) - 1
	return batch
}

// pick is what pickLocked chose: shard i (-1: none now), read how, from
// from if it is a replica holder's.
type pick struct {
	i    int
	how  how
	from string
}

// next picks the next shard to fetch and how, waiting while none may be
// started yet; i is -1 when every shard has been started.
func (w *swarm) next(ctx context.Context) (pick, error) {
	for {
		w.mu.Lock()
		pk, wait, stealAt := w.pickLocked(time.Now())
		if pk.i >= 0 {
			w.state[pk.i] = busy
			if pk.how != fromPeers {
				w.seedBusy++ // until the read's first attempt ends
			}
		}
		wake := w.wake
		w.mu.Unlock()
		if !wait {
			return pk, nil
		}
		var steal <-chan time.Time
		var t *time.Timer
		if !stealAt.IsZero() {
			t = time.NewTimer(time.Until(stealAt))
			steal = t.C
		}
		select {
		case <-wake:
		case <-steal:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return pick{i: -1}, context.Cause(ctx)
		}
	}
}

// pickLocked chooses the next shard and where to read it from, in this
// order:
//
//   - while a seed read slot is free (seedFree), a shard this pass claimed
//     ahead (claimAheadLocked) and nobody holds yet, or else one that
//     nobody holds or has claimed, to claim and read from a seed: the seeds send every
//     shard once before any twice, and are kept busy while shards remain
//     that no receiver has;
//   - a shard other receivers serve, read from the holder this receiver
//     reads least from now (a random one of those), the rarest shard that
//     holder has: receivers that see the same rare shard do not all queue
//     at its one holder while others' links idle, and what receivers hold
//     still spreads rarest first;
//   - while a seed slot is free, a shard that nobody holds and that no
//     other receiver fetches, this one cannot serve (it is split here) so
//     does not claim;
//   - a shard another receiver claimed, once this one has had nothing
//     else to do for patience (the endgame): the claimant may be slow, or
//     dead (its claims go when its lease does, claimTTL); again if a seed
//     slot is free.
//
// wait is whether shards remain that may be picked later; stealAt, if not
// zero, is when the last kind may be.
func (w *swarm) pickLocked(now time.Time) (pk pick, wait bool, stealAt time.Time) {
	own, fresh, lone, theirs := -1, -1, -1, -1
	clear(w.best)
	for _, i := range w.order {
		switch {
		case w.state[i] != todo:
		case w.live[i] > 0:
			for _, l := range w.view.p.Shards[i].ReplicaList {
				if b, ok := w.best[l.SegmentName]; !w.bad[l.SegmentName] && (!ok || w.live[i] < w.live[b]) {
					w.best[l.SegmentName] = i
				}
			}
		case w.claimed[i] == w.s.name:
			if own < 0 {
				own = i
			}
		case w.claimed[i] == "" && w.mine[i] != nil:
			if fresh < 0 {
				fresh = i
			}
		case w.claimed[i] == "" && len(w.fetchers) == 0:
			if lone < 0 {
				lone = i
			}
		case theirs < 0 || w.claimedAt[i].Before(w.claimedAt[theirs]):
			theirs = i
		}
	}
	free := w.seedFree()
	pk.i = -1
	switch {
	case own >= 0 && free:
		pk.i, pk.how = own, fromSeed
	case fresh >= 0 && free:
		pk.i, pk.how = fresh, claimSeed
	case len(w.best) > 0:
		pk.i, pk.from = w.leastReadLocked()
	case lone >= 0 && free:
		pk.i, pk.how = lone, fromSeed
	case own >= 0 || fresh >= 0 || lone >= 0:
		// Waits for a seed slot.
		wait = true
	case theirs >= 0:
		stealAt = w.claimedAt[theirs].Add(w.patience())
		switch {
		case now.Before(stealAt):
			return pk, true, stealAt
		case free:
			return pick{i: theirs, how: fromSeed}, false, time.Time{}
		}
		return pk, true, time.Time{}
	}
	// Shards claimed ahead in a transaction still in flight are busy
	// meanwhile; those it loses are todo again.
	wait = wait || pk.i < 0 && w.claiming > 0
	return pk, wait, time.Time{}
}

// leastReadLocked chooses among the holders in best (each with the rarest
// shard it holds that this receiver still needs) one it reads least from
// now, at random among those.
func (w *swarm) leastReadLocked() (int, string) {
	var from string
	n, least := 0, 0
	for seg := range w.best {
		switch r := w.reading[seg]; {
		case n == 0 || r < least:
			from, n, least = seg, 1, r
		case r == least:
			// Reservoir sampling, as pickFrom.
			if n++; rand.IntN(n) == 0 {
				from = seg
			}
		}
	}
	return w.best[from], from
}

// seedFree reports whether this receiver may start another read at the
// seeds now: it keeps its part of Concurrency among the receivers
// fetching, at least one, in flight there, so the seeds serve about
// Concurrency reads at a time however many receivers fetch; one alone
// keeps Concurrency of them in flight, enough to fill its link. Until its
// first read from a seed lands, one: receivers that start together enter
// the claim directory within moments of each other, and the first in
// would otherwise take a share meant for several.
func (w *swarm) seedFree() bool {
	if !w.seeded {
		return w.seedBusy == 0
	}
	return w.seedBusy < max(1, w.s.cfg.Concurrency/(len(w.fetchers)+1))
}

// patience is how long a receiver with nothing else to do allows a peer
// to read a shard it claimed from a seed and announce it: two of this
// pass's shard reads and announcements, on average, and the wait before
// an announcement. Not the slowest: one read stuck behind TCP's
// retransmission backoff (seconds on a lossy link) would make every
// receiver wait for it while the seeds idle.
func (w *swarm) patience() time.Duration {
	p := publishDelay
	if w.reads > 0 {
		p += 2 * w.readTime / time.Duration(w.reads)
	}
	if w.anns > 0 {
		p += 2 * w.annTime / time.Duration(w.anns)
	}
	return p
}

// wakeLocked tells the waiting workers that what they may pick changed.
func (w *swarm) wakeLocked() {
	close(w.wake)
	w.wake = make(chan struct{})
}

// install makes r, a record of the object at least as new as the last,
// the record of the view. It owns r: this node is struck from its lists (a
// node never reads from itself, whatever stale entries say).
func (w *swarm) install(r *record) {
	for i := range r.p.Shards {
		sh := &r.p.Shards[i]
		sh.Gold = withoutSegment(sh.Gold, w.s.name)
		sh.ReplicaList = withoutSegment(sh.ReplicaList, w.s.name)
	}
	w.rec = r
	// Announcements the record now carries are dropped: merging walks
	// only the shards landed and not yet published, not every shard
	// every receiver announced, on each record change (each publication
	// of each receiver).
	for key, h := range w.holds {
		for i := range h.at {
			if i < 0 || i >= len(r.p.Shards) ||
				slices.ContainsFunc(r.p.Shards[i].ReplicaList, func(l location) bool { return l.SegmentName == h.seg }) {
				delete(h.at, i)
			}
		}
		if len(h.at) == 0 {
			delete(w.holds, key)
		}
	}
	w.mergeLocked()
}

// mergeLocked makes the view: the record, and as replica holders the
// receivers that announced shards the record does not list them for yet.
// It walks every announcement: for a new record, or one withdrawn; a new
// announcement is added alone (holdLocked).
func (w *swarm) mergeLocked() {
	w.view, w.ownView = &record{p: w.rec.p, rev: w.rec.rev, created: w.rec.created}, false
	for _, h := range w.holds {
		for i, addr := range h.at {
			w.holdLocked(h.seg, i, addr)
		}
	}
	w.recountLocked()
}

// holdLocked adds seg as a holder of shard i at addr to the view, unless
// the view lists it already; the view's shards become its own first, so
// the record's stay as read. It does not recount.
func (w *swarm) holdLocked(seg string, i int, addr uint64) {
	if i < 0 || i >= len(w.view.p.Shards) ||
		slices.ContainsFunc(w.view.p.Shards[i].ReplicaList, func(l location) bool { return l.SegmentName == seg }) {
		return
	}
	if !w.ownView {
		p := *w.view.p
		p.Shards = slices.Clone(p.Shards)
		w.view.p, w.ownView = &p, true
	}
	sh := &w.view.p.Shards[i]
	sh.ReplicaList = append(slices.Clip(sh.ReplicaList), location{SegmentName: seg, Offset: addr})
}

// recountLocked derives from the view and the failed segments the live
// replica holders of each shard.
func (w *swarm) recountLocked() {
	for i := range w.view.p.Shards {
		w.recountShardLocked(i)
	}
}

// recountShardLocked does as recountLocked for shard i alone.
func (w *swarm) recountShardLocked(i int) {
	n := 0
	for _, l := range w.view.p.Shards[i].ReplicaList {
		if !w.bad[l.SegmentName] {
			n++
		}
	}
	w.live[i] = n
}

// resetClaimsLocked makes the claim directory as read at rev (kvs) the
// swarm's view of it, unless it knows a newer one.
func (w *swarm) resetClaimsLocked(kvs []*mvccpb.KeyValue, rev int64) {
	if rev <= w.claimRev {
		return
	}
	clear(w.fetchers)
	clear(w.holds)
	for i, c := range w.claimed {
		if c != w.s.name {
			w.claimed[i] = ""
		}
	}
	for _, kv := range kvs {
		w.applyClaimLocked(string(kv.Key), string(kv.Value), true)
	}
	w.claimRev = rev
	w.mergeLocked()
	w.wakeLocked()
}

// applyClaimLocked applies one change to the claim directory: key was put
// with value, or deleted. It returns whether the view must be merged again.
func (w *swarm) applyClaimLocked(key, value string, put bool) (remerge bool) {
	kind, seg, i, ok := claimKey(w.cl.dir, key)
	switch {
	case !ok || seg == w.s.name || i >= len(w.claimed):
	case kind == fetcherKey && put:
		w.fetchers[seg] = true
	case kind == fetcherKey:
		delete(w.fetchers, seg)
	case kind == claimedKey && put:
		if w.claimed[i] != value {
			w.claimed[i], w.claimedAt[i] = value, time.Now()
		}
	case kind == claimedKey:
		// The claimant left (its shards are published or its pass failed)
		// or its lease ran out: the shard may be claimed again.
		w.claimed[i] = ""
	case kind == holdsKey && put:
		var at map[int]uint64
		if err := json.Unmarshal([]byte(value), &at); err != nil {
			w.s.log.Warn("skipping invalid holdings", "key", key, "err", err)
			return false
		}
		w.holds[key] = holding{seg: seg, at: at}
		for i, addr := range at {
			w.holdLocked(seg, i, addr)
			if i >= 0 && i < len(w.live) {
				w.recountShardLocked(i)
			}
		}
	case kind == holdsKey:
		// Gone with its pass: what it published is in the record.
		delete(w.holds, key)
		return true
	}
	return false
}

// followClaims applies each change of the claim directory from revision
// rev on until ctx ends. A broken watch is set up again from a fresh read.
func (w *swarm) followClaims(ctx context.Context, rev int64) {
	watch := w.cl.watch(ctx, rev+1)
	for {
		resp, ok, done := nextWatch(ctx, watch)
		if done {
			return
		}
		if ok && resp.Err() == nil {
			w.mu.Lock()
			remerge := false
			for _, ev := range resp.Events {
				if w.applyClaimLocked(string(ev.Kv.Key), string(ev.Kv.Value), ev.Type == clientv3.EventTypePut) {
					remerge = true
				}
			}
			if remerge {
				w.mergeLocked()
			}
			w.claimRev = max(w.claimRev, resp.Header.Revision)
			w.wakeLocked()
			w.mu.Unlock()
			continue
		}
		for {
			mctx, cancel := w.s.metaCtx(ctx)
			kvs, at, err := w.cl.read(mctx)
			cancel()
			if err == nil {
				w.mu.Lock()
				w.resetClaimsLocked(kvs, at)
				w.mu.Unlock()
				watch = w.cl.watch(ctx, at+1)
				break
			}
			w.s.log.Debug("re-reading claims for the watch", "name", w.base.p.Name, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(publishDelay):
			}
		}
	}
}

// ownerHash is the rendezvous weight of segment for shard i: FNV-1a of the
// name, mixed with the index by SplitMix64's finalizer so that every bit of
// both moves the weight (FNV alone orders two similar names the same way
// for most indexes).
func ownerHash(segment string, i int) uint64 {
	h := uint64(14695981039346656037)
	for j := 0; j < len(segment); j++ {
		h = (h ^ uint64(segment[j])) * 1099511628211
	}
	h += uint64(i) * 0x9e3779b97f4a7c15
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return h ^ h>>31
}

// see takes a newer record of the object from the watch; false if it is
// no longer the object this pass fetches (r nil: deleted).
func (w *swarm) see(r *record) bool {
	if r == nil || !sameObject(w.base, r) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.rev > w.rec.rev {
		w.install(r)
		w.wakeLocked()
	}
	return true
}

// land records that shard i is here.
func (w *swarm) land(i int) {
	w.mu.Lock()
	w.state[i] = landed
	if w.mine[i] != nil {
		w.unpub = append(w.unpub, i)
		w.held = append(w.held, i)
	}
	w.mu.Unlock()
	for _, k := range []chan struct{}{w.kick, w.kickHeld} {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

// pullShard reads shard i, trying another source after each failure, at
// least Config.Retries times and once per source. The sources are those
// of the current view, which may change between attempts. held is whether
// next took a seed slot for the shard: it is given back once the first
// attempt ends, wherever that attempt read from.
func (w *swarm) pullShard(ctx context.Context, pk pick, wk *worker) error {
	i, held := pk.i, pk.how != fromPeers
	defer func() {
		if held {
			w.mu.Lock()
			w.seedBusy--
			w.wakeLocked()
			w.mu.Unlock()
		}
	}()
	name := w.base.p.Name
	wk.tried = wk.tried[:0]
	var last error
	for k := 0; ; k++ {
		w.mu.Lock()
		sh := &w.view.p.Shards[i]
		n, tries := len(sh.Gold)+len(sh.ReplicaList), max(w.s.cfg.Retries, len(sh.Gold)+len(sh.ReplicaList))
		var loc location
		var seed bool
		if n > 0 && k < tries {
			loc, seed = source(sh, wk.tried, w.bad)
			if k == 0 && pk.from != "" {
				if j := slices.IndexFunc(sh.ReplicaList, func(l location) bool { return l.SegmentName == pk.from }); j >= 0 {
					loc, seed = sh.ReplicaList[j], false
				}
			}
			if seed && !held {
				w.seedBusy++
				held = true
			}
			w.reading[loc.SegmentName]++
		}
		w.mu.Unlock()
		switch {
		case n == 0 && last != nil:
			return fmt.Errorf("%w: shard %d of %q has no source left, last failure: %w", ErrPayloadNotFound, i, name, last)
		case n == 0:
			return fmt.Errorf("%w: shard %d of %q has no source left", ErrPayloadNotFound, i, name)
		case k >= tries:
			return fmt.Errorf("%w: shard %d of %q failed %d times, last: %w", ErrTooManyRetries, i, name, k, last)
		}
		if seed && w.s.onSeedRead != nil {
			w.s.onSeedRead(i)
		}
		start := time.Now()
		err := w.s.read(ctx, loc, wk)
		took := time.Since(start)
		w.mu.Lock()
		if w.reading[loc.SegmentName]--; w.reading[loc.SegmentName] == 0 {
			delete(w.reading, loc.SegmentName)
		}
		if err == nil {
			w.readTime += took
			w.reads++
			w.seeded = w.seeded || seed
		}
		if held {
			w.seedBusy--
			held = false
			w.wakeLocked()
		}
		if err != nil && ctx.Err() == nil && !w.bad[loc.SegmentName] {
			w.bad[loc.SegmentName] = true
			w.recountLocked()
			w.wakeLocked()
		}
		w.mu.Unlock()
		if err == nil {
			w.s.log.Debug("shard read", "name", name, "shard", i, "source", loc.SegmentName, "seed", seed,
				"at", start, "took", took)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("shard %d of %q: %w", i, name, context.Cause(ctx))
		}
		w.s.log.Info("shard read failed, trying another source", "name", name, "shard", i,
			"source", loc.SegmentName, "attempt", k+1, "of", tries, "err", err)
		last = err
		wk.tried = append(wk.tried, loc)
	}
}

// source picks where to read shard sh from, given the sources that already
// failed it (tried) and the segments that failed any shard (bad): a random
// replica holder (those who hold the bytes spare the seed), else a random
// seed, among the sources neither tried nor bad; then among those not
// tried; once all have failed, each in turn again, seeds first. seed is
// whether the pick is a seed.
func source(sh *shard, tried []location, bad map[string]bool) (loc location, seed bool) {
	for _, skipBad := range [2]bool{true, false} {
		ok := func(l location) bool { return !slices.Contains(tried, l) && !(skipBad && bad[l.SegmentName]) }
		if l, found := pickFrom(sh.ReplicaList, ok); found {
			return l, false
		}
		if l, found := pickFrom(sh.Gold, ok); found {
			return l, true
		}
	}
	k := len(tried) % (len(sh.Gold) + len(sh.ReplicaList))
	if k < len(sh.Gold) {
		return sh.Gold[k], true
	}
	return sh.ReplicaList[k-len(sh.Gold)], false
}

// pickFrom returns a random element of ls that ok accepts.
func pickFrom(ls []location, ok func(location) bool) (location, bool) {
	var pick location
	n := 0
	for _, l := range ls {
		// Reservoir sampling: each accepted element ends up the pick with
		// the same chance, without a list of them.
		if ok(l) {
			if n++; rand.IntN(n) == 0 {
				pick = l
			}
		}
	}
	return pick, n > 0
}

// nextWatch is the next response of watch (ok false: the watch closed);
// done once ctx has ended.
func nextWatch(ctx context.Context, watch clientv3.WatchChan) (resp clientv3.WatchResponse, ok, done bool) {
	select {
	case <-ctx.Done():
		return resp, false, true
	case resp, ok = <-watch:
	}
	return resp, ok, ctx.Err() != nil
}

// follow applies each change of the record to the view until ctx ends; a
// replaced object aborts the pass.
func (w *swarm) follow(ctx context.Context, abort context.CancelCauseFunc) {
	name := w.base.p.Name
	watch := w.s.meta.watch(ctx, name, w.base.rev+1)
	for {
		resp, ok, done := nextWatch(ctx, watch)
		if done {
			return
		}
		if !ok || resp.Err() != nil {
			// The watch broke (its revision was compacted, say): read the
			// record again and follow it from there.
			var same bool
			if watch, same = w.rewatch(ctx); !same {
				abort(errReplaced)
				return
			}
			continue
		}
		for _, ev := range resp.Events {
			var r *record
			if ev.Type == clientv3.EventTypePut {
				var err error
				if r, err = decodeRecord(name, ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision); err != nil {
					w.s.log.Warn("skipping invalid record", "name", name, "err", err)
					continue
				}
			}
			if !w.see(r) {
				abort(errReplaced)
				return
			}
		}
	}
}

// publishLoop publishes landed shards until ctx ends, once publishBatch of
// them wait or the oldest has waited publishDelay. A failed publish (etcd
// failed, the object was replaced) aborts the pass.
func (w *swarm) publishLoop(ctx context.Context, abort context.CancelCauseFunc) {
	var due <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			if due == nil {
				due = time.After(publishDelay)
			}
			w.mu.Lock()
			now := len(w.unpub) >= publishBatch
			w.mu.Unlock()
			if !now {
				continue
			}
		case <-due:
		}
		due = nil
		if err := w.publish(ctx); err != nil {
			if ctx.Err() == nil {
				abort(err)
			}
			return
		}
	}
}

// announceLoop announces the shards this pass holds (claims.announce),
// those not announced yet, until ctx ends: once publishBatch of them wait
// or the oldest has waited publishDelay. A failed announcement is logged
// and made again with the next: the shards are published in the record
// meanwhile. Once the lease is renewed, every shard held is announced
// anew: the announcements went with the old lease.
func (w *swarm) announceLoop(ctx context.Context) {
	var due <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kickHeld:
			if due == nil {
				due = time.After(publishDelay)
			}
			w.mu.Lock()
			now := len(w.held)-w.announced >= publishBatch
			w.mu.Unlock()
			if !now {
				continue
			}
		case <-w.cl.renewed:
		case <-due:
		}
		due = nil
		w.mu.Lock()
		if _, gen := w.cl.current(); gen != w.annGen {
			w.announced, w.annGen = 0, gen
		}
		from, n, gen := w.announced, len(w.held), w.annGen
		batch := make(map[int]uint64, n-from)
		for _, i := range w.held[from:n] {
			batch[i] = w.mine[i].Offset
		}
		w.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		mctx, cancel := w.s.metaCtx(ctx)
		start := time.Now()
		got, err := w.cl.announce(mctx, batch)
		took := time.Since(start)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.s.log.Debug("announcing shards failed", "name", w.base.p.Name, "err", err)
			}
			due = time.After(publishDelay)
			continue
		}
		w.mu.Lock()
		switch {
		case got == gen || from == 0:
			w.announced, w.annGen = n, got
		default:
			// The lease was renewed on the way: the announcements before
			// this one went with the old one.
			w.announced, w.annGen = 0, got
			due = time.After(0)
		}
		w.annTime += took
		w.anns++
		w.mu.Unlock()
	}
}

// rewatch reads the record and watches it from there; same is false when
// it is no longer the object this pass fetches. A failed read is retried
// after a pause; once ctx ends the watch is nil.
func (w *swarm) rewatch(ctx context.Context) (_ clientv3.WatchChan, same bool) {
	for {
		mctx, cancel := w.s.metaCtx(ctx)
		r, err := w.s.meta.get(mctx, w.base.p.Name)
		cancel()
		if err == nil {
			if !w.see(r) {
				return nil, false
			}
			return w.s.meta.watch(ctx, w.base.p.Name, r.rev+1), true
		}
		w.s.log.Debug("re-reading record for the watch", "name", w.base.p.Name, "err", err)
		select {
		case <-ctx.Done():
			return nil, true
		case <-time.After(publishDelay):
		}
	}
}

// publish adds this node to the replica lists of the shards landed since
// the last publish, in one compare-and-swap, and checks that the object is
// still the one this pass fetches: errReplaced if not. The record written
// becomes the view: it holds every publication before this one.
func (w *swarm) publish(ctx context.Context) error {
	w.mu.Lock()
	batch := slices.Clone(w.unpub)
	w.mu.Unlock()
	replaced, seen, tries := false, false, 0
	mctx, cancel := w.s.metaCtx(ctx)
	defer cancel()
	start := time.Now()
	written, err := w.s.meta.edit(mctx, w.base.p.Name, func(cur *record) (bool, error) {
		seen = true
		tries++
		if replaced = !sameObject(w.base, cur); replaced {
			return false, nil
		}
		mod := false
		for _, i := range batch {
			if sh := &cur.p.Shards[i]; !slices.Contains(sh.ReplicaList, *w.mine[i]) {
				sh.ReplicaList = append(sh.ReplicaList, *w.mine[i])
				mod = true
			}
		}
		return mod, nil
	})
	switch {
	case err != nil:
		return err
	case !seen || replaced:
		return errReplaced
	}
	took := time.Since(start)
	if len(batch) > 0 {
		w.s.log.Debug("shards published", "name", w.base.p.Name, "shards", batch, "at", start, "took", took, "tries", tries)
	}
	w.mu.Lock()
	// land only appends, so the batch is still the front of unpub.
	w.unpub = slices.Delete(w.unpub, 0, len(batch))
	if written != nil && written.rev > w.rec.rev {
		w.install(written)
	}
	w.wakeLocked()
	w.mu.Unlock()
	if w.s.afterPublish != nil {
		w.s.afterPublish(batch)
	}
	return nil
}

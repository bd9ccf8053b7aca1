package p2p

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

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
)

// shardState is where a shard stands in a pass.
type shardState uint8

const (
	todo   shardState = iota // not started
	busy                     // a worker is reading it
	landed                   // here, published or about to be
)

// swarm is one pass of a GetReplica over one version of an object: the
// receiver's schedule of shards, its view of who serves what, and the
// shards it holds but has not published yet. Workers take shards from it;
// one goroutine follows the record in etcd (a watch), another publishes
// landed shards in batches.
type swarm struct {
	s      *Store
	base   *record     // the object as the pass began
	lay    *layout     // where its bytes go here
	starts []uint64    // object offset of each shard
	mine   []*location // this node's copy of each shard; nil where it is split
	order  []int       // the shards by this node's weight for them, heaviest first

	mu          sync.Mutex
	view        *record         // the newest record seen, this node left out; never modified
	state       []shardState    // per shard
	live        []int           // per shard: replica holders in view not in bad
	owned       []bool          // per shard: this receiver reads it from a seed
	peers       map[string]bool // other receivers in view, not in bad
	informed    time.Time       // when the view first showed this node's own publication; zero: not yet
	probed      bool            // a seed read of a shard it can publish began before informed
	seedBusy    int             // reads from a seed in flight
	bad         map[string]bool // segments that failed a read in this pass
	starved     time.Time       // since when only others' shards are left; zero: not
	slowRead    time.Duration   // the longest shard read so far
	slowPublish time.Duration   // the longest publish so far
	unpub       []int           // landed shards not yet published, in landing order
	wake        chan struct{}   // closed, and replaced, when a worker may pick anew

	kick chan struct{} // a shard landed: wakes publishLoop
}

func newSwarm(s *Store, r *record, lay *layout) *swarm {
	n := len(r.p.Shards)
	w := &swarm{
		s: s, base: r, lay: lay,
		starts: make([]uint64, n), mine: make([]*location, n), order: make([]int, n),
		state: make([]shardState, n), live: make([]int, n), owned: make([]bool, n),
		peers: map[string]bool{}, bad: map[string]bool{},
		wake: make(chan struct{}), kick: make(chan struct{}, 1),
	}
	// Weights differ from node to node: so do the orders in which they
	// read the shards, and each reads first the shards it is likeliest to
	// own (see recountLocked), whoever else turns up.
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
	// A receiver that can serve nothing learns nothing from its
	// publications: it goes by what it sees.
	if !slices.ContainsFunc(w.mine, func(l *location) bool { return l != nil }) {
		w.informed = time.Now()
	}
	w.install(r)
	return w
}

// pass fetches every shard of r into lay, Config.Concurrency at a time,
// publishing them as they land; the first failure stops the others. It
// returns errReplaced when r stopped being the object on the way.
func (s *Store) pass(ctx context.Context, r *record, lay *layout) error {
	w := newSwarm(s, r, lay)
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	sctx, stopSync := context.WithCancel(ctx)
	var syncer, workers sync.WaitGroup
	syncer.Go(func() { w.follow(sctx, abort) })
	syncer.Go(func() { w.publishLoop(sctx, abort) })
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
		i, err := w.next(ctx)
		if err != nil || i < 0 {
			return err
		}
		wk.pieces = w.lay.pieces(wk.pieces[:0], w.starts[i], w.base.p.Shards[i].Size)
		if err := w.pullShard(ctx, i, &wk); err != nil {
			return err
		}
		w.land(i)
		if w.s.afterShard != nil {
			w.s.afterShard(i)
		}
	}
}

// next claims the next shard to fetch, waiting while none may be started
// yet; -1 when every shard has been started.
func (w *swarm) next(ctx context.Context) (int, error) {
	for {
		w.mu.Lock()
		i, wait, stealAt := w.pickLocked(time.Now())
		if i >= 0 {
			w.state[i] = busy
		}
		wake := w.wake
		w.mu.Unlock()
		if !wait {
			return i, nil
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
			return -1, context.Cause(ctx)
		}
	}
}

// pickLocked chooses the next shard, in this order:
//
//   - one that another receiver serves, the rarest such, so what receivers
//     hold spreads among them and costs the seed nothing;
//   - one only a seed serves and that this receiver owns (see
//     recountLocked), if seedFree;
//   - one only a seed serves that another receiver owns, once this one has
//     had nothing else to do for patience: the owner may have died, or
//     be unable to serve it; again if seedFree.
//
// wait is whether shards remain that may be picked later; stealAt, if not
// zero, is when the last kind may be.
func (w *swarm) pickLocked(now time.Time) (i int, wait bool, stealAt time.Time) {
	shared, mine, theirs := -1, -1, -1
	for _, i := range w.order {
		switch {
		case w.state[i] != todo:
		case w.live[i] > 0:
			if shared < 0 || w.live[i] < w.live[shared] {
				shared = i
			}
		case w.owned[i]:
			// Before its first publication a receiver probes with a
			// shard it can publish, if it has one.
			if mine < 0 || w.informed.IsZero() && w.mine[mine] == nil && w.mine[i] != nil {
				mine = i
			}
		case theirs < 0:
			theirs = i
		}
	}
	switch {
	case shared >= 0:
		w.starved = time.Time{}
		return shared, false, time.Time{}
	case mine >= 0:
		w.starved = time.Time{}
		if w.seedFree(now) {
			w.probed = w.probed || w.informed.IsZero() && w.mine[mine] != nil
			return mine, false, time.Time{}
		}
		return -1, true, time.Time{}
	case theirs < 0:
		return -1, false, time.Time{}
	}
	if w.starved.IsZero() {
		w.starved = now
	}
	stealAt = w.starved.Add(w.patience())
	switch {
	case now.Before(stealAt):
		return -1, true, stealAt
	case w.seedFree(now):
		w.probed = w.probed || w.informed.IsZero() && w.mine[theirs] != nil
		return theirs, false, time.Time{}
	}
	return -1, true, time.Time{}
}

// seedFree reports whether this receiver may start another read at the
// seeds now.
//
// Until it has published and seen the record as of its publication, it
// cannot know who else fetches, nor they it: it reads one shard it can
// publish from the seeds (and any it cannot, one at a time), and takes
// from its peers meanwhile. Receivers that start together would otherwise
// each read much of the object from the seed before hearing of one
// another. For patience after that, it reads one shard at a time from the
// seeds still: those that started with it may not have published yet, and
// it would take their shards (it may believe itself alone). After that it
// keeps its part of Concurrency among the receivers it knows of, at least
// one, in flight: the seeds serve about Concurrency reads at a time however
// many receivers fetch.
func (w *swarm) seedFree(now time.Time) bool {
	switch {
	case w.informed.IsZero():
		return !w.probed && w.seedBusy == 0
	case now.Before(w.informed.Add(w.patience())):
		return w.seedBusy == 0
	}
	return w.seedBusy < max(1, w.s.cfg.Concurrency/(len(w.peers)+1))
}

// patience is how long a receiver allows its peers to publish what they
// are fetching: about two of the slowest reads and publishes it has seen.
func (w *swarm) patience() time.Duration {
	return 2*(w.slowRead+w.slowPublish) + publishDelay
}

// wakeLocked tells the waiting workers that what they may pick changed.
func (w *swarm) wakeLocked() {
	close(w.wake)
	w.wake = make(chan struct{})
}

// install makes r, a record of the object at least as new as the view,
// the view. It owns r: this node is struck from its lists (a node never
// reads from itself, whatever stale entries say).
func (w *swarm) install(r *record) {
	for i := range r.p.Shards {
		sh := &r.p.Shards[i]
		n := len(sh.ReplicaList)
		sh.Gold = withoutSegment(sh.Gold, w.s.name)
		sh.ReplicaList = withoutSegment(sh.ReplicaList, w.s.name)
		if w.informed.IsZero() && len(sh.ReplicaList) != n {
			w.informed = time.Now()
		}
	}
	w.view = r
	w.recountLocked()
}

// recountLocked derives from the view and the failed segments the live
// replica holders of each shard, the other receivers, and which shards
// this receiver owns.
//
// Receivers that start together would each read much of the object from
// the seed before their publications reach one another. So the shards only
// a seed serves are split among the receivers by rendezvous hashing on
// (segment, shard): each receiver reads the shards it owns from the seed
// and takes the others' from their owners once published. Receivers that
// see the same peers agree on the split without a word; while they do not,
// the few reads seedFree allows may be duplicated.
func (w *swarm) recountLocked() {
	clear(w.peers)
	for i, sh := range w.view.p.Shards {
		n := 0
		for _, l := range sh.ReplicaList {
			if !w.bad[l.SegmentName] {
				w.peers[l.SegmentName] = true
				n++
			}
		}
		w.live[i] = n
	}
	for i := range w.owned {
		me := ownerHash(w.s.name, i)
		w.owned[i] = true
		for p := range w.peers {
			if h := ownerHash(p, i); h > me || h == me && p > w.s.name {
				w.owned[i] = false
				break
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
	if r.rev > w.view.rev {
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
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// pullShard reads shard i, trying another source after each failure, at
// least Config.Retries times and once per source. The sources are those
// of the current view, which may change between attempts.
func (w *swarm) pullShard(ctx context.Context, i int, wk *worker) error {
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
			if seed {
				w.seedBusy++
			}
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
		start := time.Now()
		err := w.s.read(ctx, loc, wk)
		w.mu.Lock()
		if err == nil {
			w.slowRead = max(w.slowRead, time.Since(start))
		}
		if seed {
			w.seedBusy--
			w.wakeLocked()
		}
		if err != nil && ctx.Err() == nil && !w.bad[loc.SegmentName] {
			w.bad[loc.SegmentName] = true
			w.recountLocked()
			w.wakeLocked()
		}
		w.mu.Unlock()
		if err == nil {
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

// follow applies each change of the record to the view until ctx ends; a
// replaced object aborts the pass.
func (w *swarm) follow(ctx context.Context, abort context.CancelCauseFunc) {
	name := w.base.p.Name
	watch := w.s.meta.watch(ctx, name, w.base.rev+1)
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return
		case resp, ok = <-watch:
		}
		if ctx.Err() != nil {
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
	replaced, seen := false, false
	mctx, cancel := w.s.metaCtx(ctx)
	defer cancel()
	start := time.Now()
	written, err := w.s.meta.edit(mctx, w.base.p.Name, func(cur *record) (bool, error) {
		seen = true
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
	w.mu.Lock()
	// land only appends, so the batch is still the front of unpub.
	w.unpub = slices.Delete(w.unpub, 0, len(batch))
	w.slowPublish = max(w.slowPublish, time.Since(start))
	if len(batch) > 0 && w.informed.IsZero() {
		w.informed = time.Now()
	}
	if written != nil && written.rev > w.view.rev {
		w.install(written)
	}
	w.wakeLocked()
	w.mu.Unlock()
	if w.s.afterPublish != nil {
		w.s.afterPublish(batch)
	}
	return nil
}

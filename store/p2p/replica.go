package p2p

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"

	"github.com/mooncake-go/mooncake/engine"
)

// GetReplica fetches the object name into the local buffers (addrs[i],
// sizes[i]), whose sizes must add up to the object's (their split may
// differ from the seed's), then publishes this node as a source of every
// shard that landed inside one of its buffers, so later receivers can read
// from it rather than from the seed. The buffers are registered with the
// engine and must stay valid until DeleteReplica or Close.
//
// Shards are fetched Config.Concurrency at a time, each with one READ per
// piece of the local buffers it falls in. A shard's first attempt reads
// from a random replica holder, or a random seed when there is none; later
// attempts walk the seeds, then the replicas, in order, at least
// Config.Retries times and once per source.
func (s *Store) GetReplica(ctx context.Context, name string, addrs []uintptr, sizes []uint64) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	bufs, total, err := checkBuffers(addrs, sizes)
	if err != nil {
		return err
	}
	if err := s.reserve(name, false); err != nil {
		return err
	}
	chunks, err := s.fetch(ctx, name, bufs, total)
	if err != nil {
		s.release(name)
		return err
	}
	s.open(name, chunks)
	return nil
}

// fetch pulls the object into bufs and publishes the replica; it returns
// the registered chunks, or, on error, leaves nothing registered.
func (s *Store) fetch(ctx context.Context, name string, bufs []span, total uint64) (_ []span, err error) {
	r, err := s.current(ctx, name, total)
	if err != nil {
		return nil, err
	}
	chunks, err := s.mem.add(bufs, "cpu:0")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.mem.remove(chunks)
		}
	}()
	lay := newLayout(chunks)
	for attempt := 1; ; attempt++ {
		if err := s.pull(ctx, r.p, lay); err != nil {
			return nil, err
		}
		changed, err := s.publish(ctx, r, lay)
		if err != nil {
			return nil, err
		}
		if changed == nil {
			return chunks, nil
		}
		// The object was replaced while its bytes were on the way: what
		// arrived may be stale, so fetch the new one.
		if attempt >= s.cfg.Retries {
			return nil, fmt.Errorf("%w: %q changed under %d fetches", ErrTooManyRetries, name, attempt)
		}
		if changed.p.Size != total {
			return nil, fmt.Errorf("%w: %q is now %d bytes, buffers hold %d", ErrInvalidArgument, name, changed.p.Size, total)
		}
		s.log.Info("object replaced during fetch, fetching again", "name", name)
		r = changed
	}
}

// current reads name and checks it fits total bytes.
func (s *Store) current(ctx context.Context, name string, total uint64) (*record, error) {
	mctx, cancel := s.metaCtx(ctx)
	defer cancel()
	r, err := s.meta.get(mctx, name)
	switch {
	case err != nil:
		return nil, err
	case r == nil:
		return nil, fmt.Errorf("%w: %q", ErrPayloadNotFound, name)
	case r.p.Size != total:
		return nil, fmt.Errorf("%w: %q is %d bytes, buffers hold %d", ErrInvalidArgument, name, r.p.Size, total)
	}
	return r, nil
}

// layout maps the object's byte offsets onto the local chunks.
type layout struct {
	chunks []span
	starts []uint64 // object offset of each chunk's first byte
}

func newLayout(chunks []span) *layout {
	l := &layout{chunks: chunks, starts: make([]uint64, len(chunks))}
	var off uint64
	for i, c := range chunks {
		l.starts[i] = off
		off += c.size
	}
	return l
}

// piece is the part of a shard that falls in one local chunk.
type piece struct {
	local uint64 // address here
	off   uint64 // offset within the shard
	size  uint64
}

// pieces appends to dst the pieces of the object range [at, at+n), which
// must lie within the layout.
func (l *layout) pieces(dst []piece, at, n uint64) []piece {
	i := sort.Search(len(l.chunks), func(i int) bool { return l.starts[i]+l.chunks[i].size > at })
	for off := uint64(0); off < n; i++ {
		c, in := l.chunks[i], at+off-l.starts[i]
		k := min(n-off, c.size-in)
		dst = append(dst, piece{local: c.addr + in, off: off, size: k})
		off += k
	}
	return dst
}

// pull fetches every shard of p into the layout, Concurrency shards at a
// time; the first failure stops the others.
func (s *Store) pull(ctx context.Context, p *payload, lay *layout) error {
	starts := make([]uint64, len(p.Shards))
	var off uint64
	for i, sh := range p.Shards {
		if len(sh.Gold)+len(sh.ReplicaList) == 0 {
			return fmt.Errorf("%w: shard %d of %q has no source left", ErrPayloadNotFound, i, p.Name)
		}
		starts[i] = off
		off += sh.Size
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range min(s.cfg.Concurrency, len(p.Shards)) {
		wg.Go(func() {
			var w worker
			for i := range next {
				w.pieces = lay.pieces(w.pieces[:0], starts[i], p.Shards[i].Size)
				if err := s.pullShard(ctx, p, i, &w); err != nil {
					once.Do(func() { first = err; cancel() })
					continue
				}
				if s.afterShard != nil {
					s.afterShard(i)
				}
			}
		})
	}
feed:
	for i := range p.Shards {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = context.Cause(ctx)
	}
	return first
}

// worker is the scratch space of one fetching goroutine, reused across
// shards.
type worker struct {
	pieces []piece
	reqs   []engine.Request
}

// source picks the location for attempt k at shard sh: a random replica
// holder first (spreading receivers over those who already have the bytes
// keeps the seed's upload near one copy), then every seed and replica in
// turn.
func source(sh *shard, k int) location {
	if k == 0 {
		if n := len(sh.ReplicaList); n > 0 {
			return sh.ReplicaList[rand.IntN(n)]
		}
		return sh.Gold[rand.IntN(len(sh.Gold))]
	}
	k = (k - 1) % (len(sh.Gold) + len(sh.ReplicaList))
	if k < len(sh.Gold) {
		return sh.Gold[k]
	}
	return sh.ReplicaList[k-len(sh.Gold)]
}

func (s *Store) pullShard(ctx context.Context, p *payload, i int, w *worker) error {
	sh := &p.Shards[i]
	tries := max(s.cfg.Retries, len(sh.Gold)+len(sh.ReplicaList))
	var last error
	for k := range tries {
		loc := source(sh, k)
		err := s.read(ctx, loc, w)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("shard %d of %q: %w", i, p.Name, context.Cause(ctx))
		}
		s.log.Info("shard read failed, trying another source", "name", p.Name, "shard", i,
			"source", loc.SegmentName, "attempt", k+1, "of", tries, "err", err)
		last = err
	}
	return fmt.Errorf("%w: shard %d of %q failed %d times, last: %w", ErrTooManyRetries, i, p.Name, tries, last)
}

// read copies one shard from loc into the worker's pieces, one READ each.
func (s *Store) read(ctx context.Context, loc location, w *worker) error {
	deadline := s.deadline(ctx)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	seg, err := s.e.OpenSegment(actx, loc.SegmentName)
	if err != nil {
		return fmt.Errorf("%w: open %s: %w", ErrTransferEngine, loc.SegmentName, err)
	}
	w.reqs = w.reqs[:0]
	for _, pc := range w.pieces {
		w.reqs = append(w.reqs, engine.Request{Op: engine.Read, Local: uintptr(pc.local), Segment: seg,
			Remote: loc.Offset + pc.off, Length: pc.size})
	}
	b, err := s.e.AllocateBatch(len(w.reqs))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTransferEngine, err)
	}
	if err := s.e.Submit(b, w.reqs, engine.WithDeadline(deadline)); err != nil {
		s.e.FreeBatch(b)
		return fmt.Errorf("%w: read from %s: %w", ErrTransferEngine, loc.SegmentName, err)
	}
	st, err := s.e.Wait(actx, b)
	if err != nil {
		// Cancelled: the tasks still write into our buffers until they
		// end, at the latest at their deadline; let them before the batch
		// and, later, the memory are released.
		s.e.Wait(context.Background(), b)
		s.e.FreeBatch(b)
		return err
	}
	s.e.FreeBatch(b)
	if st.Status != engine.Completed {
		return fmt.Errorf("%w: read from %s: %s: %w", ErrTransferEngine, loc.SegmentName, st.Status, st.Err)
	}
	return nil
}

// publish adds this node to the replica lists of the shards it now holds in
// one piece. If the object was replaced since r was read it publishes
// nothing and returns the new record.
func (s *Store) publish(ctx context.Context, r *record, lay *layout) (*record, error) {
	mine := make([]*location, len(r.p.Shards))
	var at uint64
	var buf []piece
	for i, sh := range r.p.Shards {
		// A shard split over two local chunks cannot be served by one READ
		// at one address, so this node is not a source of it.
		if buf = lay.pieces(buf[:0], at, sh.Size); len(buf) == 1 {
			mine[i] = &location{SegmentName: s.name, Offset: buf[0].local}
		}
		at += sh.Size
	}
	var changed *record
	seen := false
	mctx, cancel := s.metaCtx(ctx)
	defer cancel()
	err := s.meta.edit(mctx, r.p.Name, func(cur *record) (bool, error) {
		seen, changed = true, nil
		if !sameObject(r, cur) {
			changed = cur
			return false, nil
		}
		mod := false
		for i, l := range mine {
			if sh := &cur.p.Shards[i]; l != nil && !slices.Contains(sh.ReplicaList, *l) {
				sh.ReplicaList = append(sh.ReplicaList, *l)
				mod = true
			}
		}
		return mod, nil
	})
	switch {
	case err != nil:
		return nil, err
	case !seen:
		return nil, fmt.Errorf("%w: %q was deleted while it was fetched", ErrPayloadNotFound, r.p.Name)
	}
	return changed, nil
}

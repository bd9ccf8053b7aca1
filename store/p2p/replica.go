package p2p

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/mooncake-go/mooncake/engine"
)

// GetReplica fetches the object name into the local buffers (addrs[i],
// sizes[i]), whose sizes must add up to the object's (their split may
// differ from the seed's). Each shard that lands inside one of the buffers
// is announced to the receivers fetching at the same time within a round
// trip to etcd, so they read it from here rather than from the seed, and
// published in the object's record soon after. The buffers are registered
// with the engine and must stay valid until DeleteReplica or Close. A GetReplica
// that fails withdraws what it published and leaves the buffers to the
// caller.
//
// Shards are fetched Config.Concurrency at a time: those nobody has yet
// from a seed, each claimed in etcd so that one receiver reads it, while a
// seed slot is free; otherwise those other receivers already serve, the
// rarest first; shards others claimed are waited for (see the package
// doc). When a source fails (it died, or withdrew) the shard is tried from
// the others, at least Config.Retries times and once per source.
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
// the registered chunks, or, on error, leaves nothing registered and this
// node listed nowhere.
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
		if err == nil {
			return
		}
		// Shards published on the way point into memory that is about to
		// go; take them back first, even if ctx has ended (Close).
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		if werr := s.withdraw(wctx, name, false); werr != nil {
			s.log.Warn("failed fetch left this node listed", "name", name, "err", werr)
		}
		cancel()
		s.mem.remove(chunks)
	}()
	lay := newLayout(chunks)
	for attempt := 1; ; attempt++ {
		err := s.pass(ctx, r, lay)
		if !errors.Is(err, errReplaced) {
			if err != nil {
				return nil, err
			}
			return chunks, nil
		}
		// The object was replaced while its bytes were on the way: what
		// arrived may be stale, so fetch the new one.
		if attempt >= s.cfg.Retries {
			return nil, fmt.Errorf("%w: %q changed under %d fetches", ErrTooManyRetries, name, attempt)
		}
		if r, err = s.current(ctx, name, total); err != nil {
			return nil, err
		}
		s.log.Info("object replaced during fetch, fetching again", "name", name)
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

// worker is the scratch space of one fetching goroutine, reused across
// shards.
type worker struct {
	pieces []piece
	reqs   []engine.Request
	tried  []location // sources that failed the current shard
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
	if err := s.e.Submit(ctx, b, w.reqs, engine.WithDeadline(deadline)); err != nil {
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

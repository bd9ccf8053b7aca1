package master

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/store/alloc"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// segment is one mounted DRAM segment and the allocator of its offsets.
type segment struct {
	id, name, endpoint, hostID string
	protocol                   string // "tcp"; the admin server reports it
	base, size                 uint64
	medium                     storepb.Medium // DISK: an SSD tier, for spills only
	client                     string
	alloc                      *alloc.Allocator
	idx                        int // position in Service.segList
	// dead is set (under segMu) when the segment is unmounted; replicas on
	// it are filtered out of every answer at once and dropped by the sweep
	// that follows.
	dead atomic.Bool
	// gone is the sequence number of the record that unmounted the
	// segment (0 while mounted, or without a journal). Under segMu.
	gone uint64
	// lost holds the space that sweeps free, the other pieces of striped
	// replicas that lost one here, until the record gone is durable (nil
	// while mounted). Under segMu.
	lost *lostFrees
	// drain is the segment's drain status (admin_drain.go): 0, or
	// segDraining or segDrained, when it takes no new replicas. Under segMu.
	drain uint8
	// heldUntil, while in the future, keeps new replicas off a segment
	// mounted again by ReMountSegment (ServiceConfig.RemountHold). Under
	// segMu.
	heldUntil time.Time
}

// client is what the master knows of a client: its segments and when it
// last showed it was alive.
type client struct {
	lastSeen time.Time
	hostID   string
	segs     map[string]*segment
}

// MountSegment adds seg, owned by clientID, to the pool. Mounting the same
// segment id again from the same client is a no-op; from another client it
// is InvalidParams.
func (s *Service) MountSegment(ctx context.Context, clientID string, seg *storepb.Segment) error {
	if clientID == "" {
		return storeErr(storepb.InvalidParams, "empty client id")
	}
	if err := checkSegment(seg); err != nil {
		return err
	}
	s.segMu.Lock()
	seq, err := s.mountLocked(clientID, seg, time.Time{})
	s.segMu.Unlock()
	if err != nil {
		return err
	}
	return s.durable(ctx, seq)
}

// ReMountSegment mounts every segment of segs for clientID, as a client
// does after a Ping answered NEED_REMOUNT. It is idempotent and registers
// the client even with no segments (a client that only reads).
//
// With again (the client mounts them again, told to), a segment this
// master did not have mounted comes back from a master that restarted
// without a journal, or from a client this one expired: clients may still
// hold space in it granted then (a put started, slots reserved) and write
// there, unknown to this master. Such a segment takes no new replicas for
// ServiceConfig.RemountHold, so that those writes land in space nobody
// else was given.
func (s *Service) ReMountSegment(ctx context.Context, clientID string, segs []*storepb.Segment, again bool) error {
	if clientID == "" {
		return storeErr(storepb.InvalidParams, "empty client id")
	}
	for _, seg := range segs {
		if err := checkSegment(seg); err != nil {
			return err
		}
	}
	s.segMu.Lock()
	s.touchLocked(clientID)
	var last uint64
	hold := s.remountHoldEnd(again)
	for _, seg := range segs {
		seq, err := s.mountLocked(clientID, seg, hold)
		if err != nil {
			s.segMu.Unlock()
			return err
		}
		last = max(last, seq)
	}
	s.segMu.Unlock()
	return s.durable(ctx, last)
}

func checkSegment(seg *storepb.Segment) error {
	switch {
	case seg == nil:
		return storeErr(storepb.InvalidParams, "nil segment")
	case seg.Id == "":
		return storeErr(storepb.InvalidParams, "empty segment id")
	case seg.Name == "":
		return storeErr(storepb.InvalidParams, "segment %s: empty name", seg.Id)
	case seg.Size == 0:
		return storeErr(storepb.InvalidParams, "segment %s: zero size", seg.Id)
	}
	return nil
}

// mountLocked mounts seg, held from new replicas until heldUntil when it
// is not mounted yet (zero: not held), and returns the sequence number of
// its journal record (0 when already mounted, or without a journal).
func (s *Service) mountLocked(clientID string, seg *storepb.Segment, heldUntil time.Time) (uint64, error) {
	if old, ok := s.segs[seg.Id]; ok {
		if old.client != clientID {
			return 0, storeErr(storepb.InvalidParams, "segment %s is mounted by another client", seg.Id)
		}
		s.touchLocked(clientID)
		return 0, nil
	}
	a, err := alloc.New(seg.Size)
	if err != nil {
		return 0, storeErr(storepb.InvalidParams, "segment %s: %v", seg.Id, err)
	}
	sg := newSegment(clientID, seg, a, len(s.segList))
	sg.heldUntil = heldUntil
	s.logHold(sg)
	s.segs[sg.id] = sg
	s.segList = append(s.segList, sg)
	if sg.medium == storepb.Medium_MEDIUM_DISK {
		s.diskTiers.Add(1)
	}
	c := s.touchLocked(clientID)
	c.segs[sg.id] = sg
	if sg.hostID != "" {
		c.hostID = sg.hostID
	}
	return s.record(mountRecord(clientID, seg, heldUntil)), nil
}

// mountRecord is the journal record of clientID's mount of seg, held
// until heldUntil (zero: not held).
func mountRecord(clientID string, seg *storepb.Segment, heldUntil time.Time) *storepb.JournalRecord {
	m := &storepb.JournalMount{ClientId: clientID, Segment: seg}
	if !heldUntil.IsZero() {
		m.HeldUntilUnixMs = heldUntil.UnixMilli()
	}
	return &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: m}}
}

// newSegment is seg, mounted by clientID at position idx of segList, with
// its allocator a.
func newSegment(clientID string, seg *storepb.Segment, a *alloc.Allocator, idx int) *segment {
	return &segment{
		id: seg.Id, name: seg.Name, endpoint: seg.TransportEndpoint, hostID: seg.HostId, protocol: seg.Protocol,
		base: seg.Base, size: seg.Size, client: clientID, alloc: a, idx: idx, medium: seg.Medium,
	}
}

// touchLocked records that clientID is alive, registering it if new.
func (s *Service) touchLocked(clientID string) *client {
	c := s.clients[clientID]
	if c == nil {
		c = &client{segs: make(map[string]*segment)}
		s.clients[clientID] = c
	}
	c.lastSeen = s.now()
	return c
}

// UnmountSegment removes a segment from the pool. Every replica on it is
// dropped; objects left with no complete replica are removed.
func (s *Service) UnmountSegment(ctx context.Context, clientID, segmentID string) error {
	s.segMu.Lock()
	sg, ok := s.segs[segmentID]
	switch {
	case !ok:
		s.segMu.Unlock()
		return storeErr(storepb.SegmentNotFound, "segment %s", segmentID)
	case sg.client != clientID:
		s.segMu.Unlock()
		return storeErr(storepb.InvalidParams, "segment %s belongs to another client", segmentID)
	}
	s.removeSegLocked(sg)
	lost := &lostFrees{}
	seq := lost.after(s, &storepb.JournalRecord{Op: &storepb.JournalRecord_Unmount{Unmount: &storepb.JournalUnmount{SegmentId: segmentID}}})
	sg.gone, sg.lost = seq, lost
	s.segMu.Unlock()
	s.sweepDead()
	return s.durable(ctx, seq)
}

func (s *Service) removeSegLocked(sg *segment) {
	sg.dead.Store(true)
	// Replaced values waiting for a lease to end lose their replicas here.
	kept := s.deferred[:0]
	for _, d := range s.deferred {
		d.reps = slices.DeleteFunc(d.reps, replica.allDead)
		if len(d.reps) > 0 {
			kept = append(kept, d)
		}
	}
	clear(s.deferred[len(kept):])
	s.deferred = kept
	delete(s.segs, sg.id)
	if sg.medium == storepb.Medium_MEDIUM_DISK {
		s.diskTiers.Add(-1)
	}
	last := s.segList[len(s.segList)-1]
	s.segList[sg.idx], last.idx = last, sg.idx
	s.segList = s.segList[:len(s.segList)-1]
	if c := s.clients[sg.client]; c != nil {
		delete(c.segs, sg.id)
	}
}

// sweepDead drops every replica on an unmounted segment. Segments are
// marked dead before the sweep and no allocation lands on a dead segment,
// so one pass over the shards finds them all. The space it frees is held
// until the records of the unmounts that lost it are durable (lostFrees).
func (s *Service) sweepDead() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			was, media := o.complete(), s.kvMediaOf(o.replicas)
			// A striped replica that lost a piece is lost; its other
			// pieces are freed once no reader may be copying them (the
			// lease) or, for a put in flight, once its writer is presumed
			// gone (as a zombie put is pre-empted).
			o.replicas = s.dropDead(o.replicas, o.lease)
			if was && !o.complete() {
				s.emit(storepb.ObjectEventKind_OBJECT_EVENT_KIND_EVICTED, key)
			}
			s.kvChange(key, media, s.kvMediaOf(o.replicas), false)
			if p := o.pending; p != nil {
				p.replicas = s.dropDead(p.replicas, p.started.Add(s.cfg.PutStartDiscardTimeout))
				if len(p.replicas) == 0 {
					o.pending = nil
				}
			}
			if t := o.moving; t != nil && (o.empty() || t.src.dead() || t.dst.dead()) {
				// The move cannot end well: its object goes, or its source
				// or target went. Detached, it frees its target when the
				// client reports or it expires, and a spill's DRAM bytes
				// stop counting as on their way out.
				s.orphanLocked(o)
			}
			if o.empty() {
				if was {
					sh.gone.forgot(key, o.size, o.checksum) // tier_announce.go
				}
				delete(sh.objects, key)
			}
			s.reorderLocked(sh, key, o)
		}
		sh.mu.Unlock()
	}
}

// dropDead returns reps without the replicas a piece of which is on an
// unmounted segment; the pieces of those still mounted (striped replicas)
// are freed at until, or now if that has passed, once the records of
// the unmounts that lost them are durable.
func (s *Service) dropDead(reps []replica, until time.Time) []replica {
	return slices.DeleteFunc(reps, func(r replica) bool {
		if !r.dead() {
			return false
		}
		if !r.allDead() {
			s.lossOf(r).free(s, deferredFree{at: until, reps: []replica{r}})
		}
		return true
	})
}

// lossOf returns the lostFrees of the unmount recorded last among those
// of r's dead pieces: the sweep of one unmount may find a replica that
// another, recorded after it, left with a dead piece, and records are
// durable in order.
func (s *Service) lossOf(r replica) *lostFrees {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	var last *segment
	r.pieces(func(p replica) {
		if p.seg.dead.Load() && (last == nil || p.seg.gone > last.gone) {
			last = p.seg
		}
	})
	if last == nil {
		return nil
	}
	return last.lost
}

// lostFrees holds the space a sweep frees, the other pieces of striped
// replicas that lost one, until the records of the unmounts that lost
// them are durable: a new leader replaying a journal without them still
// has those replicas, whose pieces must not hold a newer put's bytes by
// then (as freeAfter). A nil lostFrees holds nothing.
type lostFrees struct {
	mu      sync.Mutex
	records int // the unmounts' records not durable yet
	held    []deferredFree
}

// after journals rec, an unmount, whose durability lets l's space go.
// segMu is held.
func (l *lostFrees) after(s *Service, rec *storepb.JournalRecord) uint64 {
	l.mu.Lock()
	l.records++
	l.mu.Unlock()
	return s.after(rec, l.durable(s))
}

// durable is the callback of one of the unmounts' records. It runs with
// segMu held when the journal calls it at once (none): nothing is held
// yet then, the sweep comes after.
func (l *lostFrees) durable(s *Service) func() {
	return func() {
		l.mu.Lock()
		l.records--
		var held []deferredFree
		if l.records == 0 {
			held, l.held = l.held, nil
		}
		l.mu.Unlock()
		for _, d := range held {
			s.freeLost(d)
		}
	}
}

// free frees d once the unmounts' records are durable.
func (l *lostFrees) free(s *Service, d deferredFree) {
	if l != nil {
		l.mu.Lock()
		if l.records > 0 {
			l.held = append(l.held, d)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
	s.freeLost(d)
}

// freeLost frees d's replicas at d.at, or now if that has passed.
func (s *Service) freeLost(d deferredFree) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	if !d.at.After(s.now()) {
		s.freeLocked(d.reps)
		return
	}
	// Pieces on segments unmounted meanwhile have nothing to free; under
	// segMu none can die unseen (removeSegLocked prunes the rest).
	if d.reps = slices.DeleteFunc(d.reps, replica.allDead); len(d.reps) > 0 {
		s.deferred = append(s.deferred, d)
	}
}

// Ping records that clientID is alive. It answers NEED_REMOUNT for a
// client the master does not know (it restarted, or expired the client),
// which then calls ReMountSegment.
func (s *Service) Ping(clientID string) (viewVersion uint64, status storepb.ClientStatus) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	c := s.clients[clientID]
	if c == nil {
		return s.cfg.ViewVersion, storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT
	}
	c.lastSeen = s.now()
	return s.cfg.ViewVersion, storepb.ClientStatus_CLIENT_STATUS_OK
}

// PingTasks is Ping that also hands the client the moves queued for it.
func (s *Service) PingTasks(ctx context.Context, clientID string) (uint64, storepb.ClientStatus, []*storepb.MoveTask) {
	v, st := s.Ping(clientID)
	if st != storepb.ClientStatus_CLIENT_STATUS_OK {
		return v, st, nil
	}
	return v, st, s.takeTasks(ctx, clientID)
}

// ExpireClients forgets clients not seen within ClientTTL and unmounts
// their segments, as Mooncake's client monitor. It returns how many.
func (s *Service) ExpireClients() int {
	deadline := s.now().Add(-s.cfg.ClientTTL)
	n := 0
	lost := &lostFrees{}
	s.segMu.Lock()
	for id, c := range s.clients {
		if !c.lastSeen.Before(deadline) {
			continue
		}
		segs := make([]*segment, 0, len(c.segs))
		for _, sg := range c.segs {
			segs = append(segs, sg)
			s.removeSegLocked(sg)
		}
		delete(s.clients, id)
		seq := lost.after(s, &storepb.JournalRecord{Op: &storepb.JournalRecord_Expire{Expire: &storepb.JournalExpire{ClientId: id}}})
		for _, sg := range segs {
			sg.gone, sg.lost = seq, lost
		}
		n++
	}
	s.segMu.Unlock()
	if n > 0 {
		s.sweepDead()
	}
	return n
}

// usageLocked sums capacity and used bytes over the mounted segments of
// medium m: DRAM is the pool eviction watches; SSD tiers are apart.
func (s *Service) usageLocked(m storepb.Medium) (capacity, used uint64) {
	for _, sg := range s.segList {
		if sg.medium == m {
			capacity += sg.alloc.Size()
			used += sg.alloc.Used()
		}
	}
	return capacity, used
}

// fitsAnywhere reports whether some segment that takes puts could ever
// hold n bytes, or, cut into k pieces, enough of them each their piece.
// Segments draining or held after a remount do not count: a put that only
// they could take fails at once rather than evict for room it would not be
// given (and leave the next eviction forced, to take the first objects put
// once a hold ends).
func (s *Service) fitsAnywhere(n uint64, k int) bool {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	piece, fit := pieceSize(n, k), 0
	for _, sg := range s.segList {
		if !s.placeableLocked(sg) {
			continue
		}
		if sz := sg.alloc.Size(); sz >= n {
			return true
		} else if sz >= piece {
			fit++
		}
	}
	return k > 1 && fit >= int((n+piece-1)/piece)
}

// stripesFor is the pieces each replica of a put of size bytes is cut
// into: what the put asks for, else the master's policy; at most one per
// minPiece of the value.
func (s *Service) stripesFor(size uint64, cfg *storepb.ReplicateConfig) int {
	k := int(cfg.GetStripeCount())
	if k == 0 && s.cfg.StripeMinSize > 0 && size >= s.cfg.StripeMinSize {
		k = s.cfg.StripeCount
	}
	return int(min(uint64(max(k, 1)), max(size/minPiece, 1)))
}

// pieceSize is the length of every piece but the last when size bytes
// are cut into k: equal, page-aligned (pieceAlign). The value then takes
// ceil(size / pieceSize) pieces, k or fewer.
func pieceSize(size uint64, k int) uint64 {
	p := (size + uint64(k) - 1) / uint64(k)
	return (p + pieceAlign - 1) / pieceAlign * pieceAlign
}

// allocate places up to n replicas of size bytes on distinct segments,
// best effort, in the order the strategy gives; replicas of a value
// stripesFor cuts are striped (allocStripedLocked).
func (s *Service) allocate(clientID string, size uint64, n int, cfg *storepb.ReplicateConfig) []replica {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	if k := s.stripesFor(size, cfg); k > 1 {
		return s.allocStripedLocked(clientID, size, n, k, cfg)
	}
	out := make([]replica, 0, n)
	s.placeLocked(clientID, cfg, func(sg *segment) bool {
		if len(out) == n {
			return true
		}
		if !s.placeableLocked(sg) {
			return false
		}
		for _, r := range out {
			if r.seg == sg {
				return false
			}
		}
		if off, ok := sg.alloc.Alloc(size); ok {
			out = append(out, replica{seg: sg, off: off, size: size})
		}
		return len(out) == n
	})
	return out
}

// remountHoldEnd is when a hold that starts now ends, for a segment
// mounted again (again) unknown to the master; zero: none. In memory it
// keeps the clock's monotonic reading; the journal keeps its wall-clock
// milliseconds.
func (s *Service) remountHoldEnd(again bool) time.Time {
	if !again || s.cfg.RemountHold <= 0 {
		return time.Time{}
	}
	return s.now().Add(s.cfg.RemountHold)
}

// logHold says that sg, just mounted, is held from new replicas.
func (s *Service) logHold(sg *segment) {
	if !sg.heldUntil.IsZero() {
		slog.Info("master: segment mounted again, held from new replicas", "segment", sg.id, "name", sg.name,
			"client", sg.client, "for", sg.heldUntil.Sub(s.now()).Round(time.Millisecond))
	}
}

// placeableLocked reports whether puts may go to sg: DRAM (SSD tiers take
// spills), not being drained, not held after a remount. segMu is held.
func (s *Service) placeableLocked(sg *segment) bool {
	return sg.medium == storepb.Medium_MEDIUM_DRAM && sg.drain == 0 && !s.heldLocked(sg)
}

// heldFor returns how many segments held after a remount could hold size
// bytes when their hold ends, and the longest time one is held for yet.
func (s *Service) heldFor(size uint64) (n int, left time.Duration) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, sg := range s.segList {
		if sg.medium == storepb.Medium_MEDIUM_DRAM && s.heldLocked(sg) && sg.size >= size {
			n++
			left = max(left, sg.heldUntil.Sub(s.now()))
		}
	}
	return n, left
}

// heldLocked reports whether sg is held after a remount, ending a hold
// that has run out. segMu is held.
func (s *Service) heldLocked(sg *segment) bool {
	if sg.heldUntil.IsZero() {
		return false
	}
	now := s.now()
	if s.cfg.RemountHold <= 0 {
		sg.heldUntil = time.Time{} // a hold from the journal, turned off since
		return false
	}
	if sg.heldUntil.Sub(now) > s.cfg.RemountHold {
		// A hold from the journal is a wall-clock time: a clock stepped
		// back, or a leader's clock behind its predecessor's, holds no
		// longer than a hold that starts now.
		sg.heldUntil = now.Add(s.cfg.RemountHold)
	}
	if now.Before(sg.heldUntil) {
		return true
	}
	sg.heldUntil = time.Time{}
	return false
}

// placeLocked calls visit with the segments in placement order until it
// returns true: the preferred segments (by name; a client may mount
// several under one name) first, then the caller's host, then the
// strategy's order. A segment may come more than once. segMu is held.
func (s *Service) placeLocked(clientID string, cfg *storepb.ReplicateConfig, visit func(sg *segment) bool) {
	if len(s.segList) == 0 {
		return
	}
	for _, name := range cfg.GetPreferredSegments() {
		for _, sg := range s.segList {
			if sg.name == name && visit(sg) {
				return
			}
		}
	}
	if cfg.GetPreferLocal() || s.cfg.Strategy == StrategyLocalFirst {
		if c := s.clients[clientID]; c != nil && c.hostID != "" {
			for _, sg := range s.segList {
				if sg.hostID == c.hostID && visit(sg) {
					return
				}
			}
		}
	}
	if s.cfg.Strategy == StrategyFreeRatioFirst {
		// Mooncake samples min(6·remaining, n) candidates; sorting them all
		// is the same order without the sampling noise.
		order := slices.Clone(s.segList)
		slices.SortFunc(order, func(a, b *segment) int {
			fa := float64(a.alloc.FreeBytes()) / float64(a.alloc.Size())
			fb := float64(b.alloc.FreeBytes()) / float64(b.alloc.Size())
			switch {
			case fa > fb:
				return -1
			case fa < fb:
				return 1
			}
			return 0
		})
		for _, sg := range order {
			if visit(sg) {
				return
			}
		}
		return
	}
	// Random: consecutive segments from a random start.
	start := s.rng.IntN(len(s.segList))
	for i := range s.segList {
		if visit(s.segList[(start+i)%len(s.segList)]) {
			return
		}
	}
}

// allocStripedLocked places up to n replicas of size bytes, each cut into
// k pieces (stripeLocked), no two pieces of the value on one segment, the
// segments taken in placement order. segMu is held.
func (s *Service) allocStripedLocked(clientID string, size uint64, n, k int, cfg *storepb.ReplicateConfig) []replica {
	var cands []*segment
	seen := make(map[*segment]bool)
	s.placeLocked(clientID, cfg, func(sg *segment) bool {
		if s.placeableLocked(sg) && !seen[sg] {
			seen[sg] = true
			cands = append(cands, sg)
		}
		return false
	})
	taken := make(map[*segment]bool, n*k)
	out := make([]replica, 0, n)
	for i := range n {
		// Striping must not cost the put a replica: each replica still
		// to place gets its share of the segments left, and more pieces
		// only where pieces that large do not fit.
		left := 0
		for _, sg := range cands {
			if !taken[sg] {
				left++
			}
		}
		share := min(k, max(left/(n-i), 1))
		r, ok := stripeLocked(size, share, cands, taken)
		if !ok && share < k {
			r, ok = stripeLocked(size, k, cands, taken)
		}
		if !ok {
			break
		}
		out = append(out, r)
	}
	return out
}

// stripeLocked places one replica of size bytes cut into k pieces on
// candidate segments not taken, a piece per host first (a host's link is
// what striping spreads over), then any; with too few places, into fewer
// pieces, down to one allocation. It marks the segments it used taken.
func stripeLocked(size uint64, k int, cands []*segment, taken map[*segment]bool) (replica, bool) {
	k = min(k, len(cands))
	for ; k >= 1; k-- {
		piece := pieceSize(size, k)
		want := int((size + piece - 1) / piece)
		pieces := make([]replica, 0, want)
		hosts := make(map[string]bool, want)
		pick := func(shareHost bool) {
			for _, sg := range cands {
				if len(pieces) == want {
					return
				}
				host := cmp.Or(sg.hostID, "client "+sg.client)
				if taken[sg] || (hosts[host] && !shareHost) || slices.ContainsFunc(pieces, func(p replica) bool { return p.seg == sg }) {
					continue
				}
				n := piece
				if len(pieces) == want-1 {
					n = size - piece*uint64(want-1)
				}
				if off, ok := sg.alloc.Alloc(n); ok {
					pieces = append(pieces, replica{seg: sg, off: off, size: n})
					hosts[host] = true
				}
			}
		}
		pick(false)
		pick(true)
		if len(pieces) < want {
			for _, p := range pieces {
				_ = p.seg.alloc.Free(p.off)
			}
			continue
		}
		for _, p := range pieces {
			taken[p.seg] = true
		}
		if want == 1 {
			return pieces[0], true
		}
		return replica{seg: pieces[0].seg, off: pieces[0].off, size: size, stripes: pieces}, true
	}
	return replica{}, false
}

// freeReplicas returns replicas' space to their segments; replicas on
// unmounted segments have nothing to free.
func (s *Service) freeReplicas(reps []replica) {
	if len(reps) == 0 {
		return
	}
	s.segMu.Lock()
	defer s.segMu.Unlock()
	s.freeLocked(reps)
}

func (s *Service) freeLocked(reps []replica) {
	for _, r := range reps {
		r.pieces(func(p replica) {
			if !p.seg.dead.Load() {
				// Free fails only for an offset not allocated, which
				// would be a bookkeeping bug here; there is nothing
				// better to do.
				_ = p.seg.alloc.Free(p.off)
			}
		})
	}
}

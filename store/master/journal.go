package master

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/alloc"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// journal takes the changes of the master's durable state in the order
// they happen. Appends are made under the lock that orders the change (a
// key's shard, or segMu), so the journal's order is the state's.
type journal interface {
	// append queues rec and returns its sequence number. done, if not nil,
	// runs once rec (and every record before it) is durable.
	append(rec *storepb.JournalRecord, done func()) uint64
	// wait blocks until record seq is durable, the journal failed, or ctx
	// ended (its error then).
	wait(ctx context.Context, seq uint64) error
	// last is the sequence number of the last record appended.
	last() uint64
}

// journalQueue is what the etcd and the local-disk journals share:
// records queued for the writer goroutine, the sequence numbers appended
// and committed, the first error, and the waiters on them. A journal
// embeds it and runs a writer that takes the queue, makes it durable and
// calls commit (or fail).
type journalQueue struct {
	mu        sync.Mutex
	cond      *sync.Cond
	queue     []entry
	next      uint64 // the seq the next append gets
	committed uint64
	err       error
	closed    bool
	sinceSnap int // records committed since the last snapshot

	// The records appended while a snapshot copies the shards (tap), when
	// tapping: those after tapFrom.
	tapping bool
	tapFrom uint64
	tapped  []tapped

	wake chan struct{} // a record was queued, or the journal closes
	done chan struct{} // closed when the writer returns
}

// entry is a queued record and its callback.
type entry struct {
	rec  *storepb.JournalRecord
	done func()
}

// initQueue continues after record last, of which the ones after the
// latest snapshot (seq snap) count towards the next one.
func (q *journalQueue) initQueue(last, snap uint64) {
	q.next, q.committed, q.sinceSnap = last+1, last, int(last-min(snap, last))
	q.cond = sync.NewCond(&q.mu)
	q.wake, q.done = make(chan struct{}, 1), make(chan struct{})
}

func (q *journalQueue) append(rec *storepb.JournalRecord, done func()) uint64 {
	q.mu.Lock()
	seq := q.next
	q.next++
	q.queue = append(q.queue, entry{rec, done})
	if q.tapping {
		q.tapped = append(q.tapped, tapped{seq, rec})
	}
	q.mu.Unlock()
	q.signal()
	return seq
}

// signal wakes the writer without blocking.
func (q *journalQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *journalQueue) last() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.next - 1
}

func (q *journalQueue) wait(ctx context.Context, seq uint64) error {
	// A sync.Cond cannot select on ctx: its end wakes the waiters instead,
	// who check it.
	stop := context.AfterFunc(ctx, func() {
		q.mu.Lock()
		q.cond.Broadcast()
		q.mu.Unlock()
	})
	defer stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.committed < seq && q.err == nil && ctx.Err() == nil {
		q.cond.Wait()
	}
	switch {
	case q.committed >= seq:
		return nil
	case q.err != nil:
		return q.err
	}
	return ctx.Err()
}

// tapper is a journal that hands a snapshot the records appended while it
// copies the shards one at a time (Service.snapshotShards).
type tapper interface {
	// startTap takes every record appended from now on and returns the
	// last one before them; false when a snapshot taps already.
	startTap() (uint64, bool)
	// tapThrough returns the records taken up to seq, in order.
	tapThrough(seq uint64) []tapped
	// stopTap stops taking records.
	stopTap()
}

var _ tapper = (*journalQueue)(nil)

// tapped is a record a snapshot took, and its sequence number.
type tapped struct {
	seq uint64
	rec *storepb.JournalRecord
}

func (q *journalQueue) startTap() (uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.tapping {
		return 0, false
	}
	q.tapping, q.tapFrom, q.tapped = true, q.next-1, nil
	return q.tapFrom, true
}

func (q *journalQueue) tapThrough(seq uint64) []tapped {
	q.mu.Lock()
	defer q.mu.Unlock()
	// Records are appended, and taken, in order.
	n, _ := slices.BinarySearchFunc(q.tapped, seq+1, func(t tapped, seq uint64) int { return cmp.Compare(t.seq, seq) })
	return slices.Clone(q.tapped[:n])
}

func (q *journalQueue) stopTap() {
	q.mu.Lock()
	q.tapping, q.tapped = false, nil
	q.mu.Unlock()
}

// failure is the journal's error, once it has one.
func (q *journalQueue) failure() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// pendingSnapshot reports how many records were committed since the last
// snapshot.
func (q *journalQueue) pendingSnapshot() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sinceSnap
}

// commit runs the callbacks of batch, records first.., which are
// durable, then makes them the committed ones.
func (q *journalQueue) commit(first uint64, batch []entry) {
	for _, e := range batch {
		if e.done != nil {
			e.done()
		}
	}
	q.mu.Lock()
	q.committed = first + uint64(len(batch)) - 1
	q.sinceSnap += len(batch)
	q.cond.Broadcast()
	q.mu.Unlock()
}

// fail records the journal's first error and wakes the waiters.
func (q *journalQueue) fail(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.cond.Broadcast()
	q.mu.Unlock()
}

// record journals rec, if the service has a journal, and returns its
// sequence number (0 without one).
func (s *Service) record(rec *storepb.JournalRecord) uint64 {
	if s.j == nil {
		return 0
	}
	return s.j.append(rec, nil)
}

// durable waits until record seq is durable; without a journal it returns
// at once. A ctx that ends first (the RPC was cancelled or timed out) ends
// the wait with an error whose cause is ctx's: the change stands in memory
// and its record may still land, as when the answer of an RPC is lost.
func (s *Service) durable(ctx context.Context, seq uint64) error {
	if s.j == nil || seq == 0 {
		return nil
	}
	if err := s.j.wait(ctx, seq); err != nil {
		return &storepb.Error{Code: storepb.EtcdOperationError, Msg: fmt.Sprintf("journal record %d", seq), Err: err}
	}
	return nil
}

// freeAfter journals rec and gives reps' space back once rec is durable:
// space must not be reused by a new put before the record saying it is
// free would survive a failover, or a new leader could hand the old
// object's replicas out over the new object's bytes.
func (s *Service) freeAfter(rec *storepb.JournalRecord, reps []replica) uint64 {
	if len(reps) == 0 {
		return s.record(rec)
	}
	if s.j == nil {
		s.freeReplicas(reps)
		return 0
	}
	// Eviction counts these bytes as free already, or it would evict again
	// and again while the record is on its way.
	var n uint64
	for _, r := range reps {
		n += r.size
	}
	s.freeing.Add(n)
	return s.j.append(rec, func() {
		s.freeReplicas(reps)
		s.freeing.Add(-n)
	})
}

// after journals rec and runs f once it is durable; without a journal it
// runs f at once.
func (s *Service) after(rec *storepb.JournalRecord, f func()) uint64 {
	if s.j == nil {
		f()
		return 0
	}
	return s.j.append(rec, f)
}

func locations(reps []replica) []*storepb.ReplicaLocation {
	out := make([]*storepb.ReplicaLocation, len(reps))
	for i, r := range reps {
		out[i] = &storepb.ReplicaLocation{SegmentId: r.seg.id, Offset: r.off, Size: r.size}
		if r.striped() {
			out[i].Stripes = locations(r.stripes)
		}
	}
	return out
}

// checkLoc refuses a striped location that is not what the leader writes
// (locations): pieces without stripes of their own that add up to the
// whole, the first where the location says it starts.
func checkLoc(l *storepb.ReplicaLocation) error {
	if len(l.Stripes) == 0 {
		return nil
	}
	var sum uint64
	for _, p := range l.Stripes {
		if len(p.Stripes) > 0 || p.Size == 0 {
			return fmt.Errorf("%w: a piece of a striped replica with stripes of its own, or empty", ErrBadRecord)
		}
		sum += p.Size
	}
	if sum != l.Size || !samePiece(l, l.Stripes[0]) {
		return fmt.Errorf("%w: a striped replica whose pieces are not the whole", ErrBadRecord)
	}
	return nil
}

// pieceLocs is l's pieces: its stripes, or l itself.
func pieceLocs(l *storepb.ReplicaLocation) []*storepb.ReplicaLocation {
	if len(l.Stripes) > 0 {
		return l.Stripes
	}
	return []*storepb.ReplicaLocation{l}
}

// samePiece reports whether a and b are one allocation.
func samePiece(a, b *storepb.ReplicaLocation) bool {
	return a.SegmentId == b.SegmentId && a.Offset == b.Offset
}

// moveLoc is locs after a drain's move of piece from (a replica, or a
// striped replica's piece) to to: a replica moved goes to the end, a
// piece keeps its replica's place, in a new location.
func moveLoc(locs []*storepb.ReplicaLocation, from, to *storepb.ReplicaLocation, toLive bool) []*storepb.ReplicaLocation {
	out := make([]*storepb.ReplicaLocation, 0, len(locs)+1)
	moved := false
	for _, l := range locs {
		switch {
		case len(l.Stripes) == 0 && samePiece(l, from):
			moved = true
		case len(l.Stripes) > 0 && slices.ContainsFunc(l.Stripes, func(p *storepb.ReplicaLocation) bool { return samePiece(p, from) }):
			if !toLive {
				continue // the piece's new place is gone: so is the replica
			}
			nl := &storepb.ReplicaLocation{Size: l.Size, Stripes: slices.Clone(l.Stripes)}
			for i, p := range nl.Stripes {
				if samePiece(p, from) {
					nl.Stripes[i] = to
				}
			}
			nl.SegmentId, nl.Offset = nl.Stripes[0].SegmentId, nl.Stripes[0].Offset
			out = append(out, nl)
		default:
			out = append(out, l)
		}
	}
	if moved && toLive {
		out = append(out, to)
	}
	return out
}

func startRecord(clientID, key string, p *pendingPut) *storepb.JournalRecord {
	return &storepb.JournalRecord{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{
		ClientId: clientID, Key: key, Size: p.size, Replicas: locations(p.replicas),
		Upsert: p.upsert, HardPin: p.cfg.GetWithHardPin(),
	}}}
}

func revokeRecord(key string) *storepb.JournalRecord {
	return &storepb.JournalRecord{Op: &storepb.JournalRecord_Revoke{Revoke: &storepb.JournalRevoke{Key: key}}}
}

func dropRecord(key string) *storepb.JournalRecord {
	return &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: key}}}
}

// ErrBadRecord is the cause of a journal that does not replay: a record
// that does not fit the state before it (an end without its start), or of
// no known kind. A leader refuses to serve from such a journal.
var ErrBadRecord = errors.New("master: journal record does not fit the state")

// state is the durable state as a journal replay builds it: segments and
// objects by id and key, replicas by location.
type state struct {
	segs    map[string]*storepb.JournalMount
	objects map[string]*storepb.ObjectState
	// moves are the targets handed out for copies not ended yet, by move
	// id; lastMoveID is the highest id handed out.
	moves      map[uint64]*storepb.JournalMoveStart
	lastMoveID uint64
	drains     map[string]*storepb.JournalDrain // drain jobs by id, as last recorded
	snapSeq    uint64                           // the snapshot the state was loaded from (0: none)
}

func newState() *state {
	return &state{segs: make(map[string]*storepb.JournalMount), objects: make(map[string]*storepb.ObjectState),
		moves: make(map[uint64]*storepb.JournalMoveStart), drains: make(map[string]*storepb.JournalDrain)}
}

// apply replays one record. Records are the leader's own, in its order; one
// that does not fit (an end without a start) is an error, so a damaged
// journal is noticed rather than half loaded.
func (st *state) apply(rec *storepb.JournalRecord) error {
	switch op := rec.Op.(type) {
	case *storepb.JournalRecord_Mount:
		if op.Mount.GetSegment().GetId() == "" {
			return fmt.Errorf("%w: mount without a segment id", ErrBadRecord)
		}
		st.segs[op.Mount.Segment.Id] = op.Mount
	case *storepb.JournalRecord_Unmount:
		delete(st.segs, op.Unmount.SegmentId)
		st.dropOn(map[string]bool{op.Unmount.SegmentId: true}, nil)
	case *storepb.JournalRecord_Expire:
		st.dropOn(st.unmountClient(op.Expire.ClientId), nil)
	case *storepb.JournalRecord_Start:
		op.Start.Replicas = slices.DeleteFunc(op.Start.Replicas, st.unmounted)
		o := st.objects[op.Start.Key]
		if o == nil {
			o = &storepb.ObjectState{Key: op.Start.Key}
			st.objects[op.Start.Key] = o
		}
		o.Pending = op.Start
	case *storepb.JournalRecord_End:
		o := st.objects[op.End.Key]
		if o == nil || o.Pending == nil || o.Pending.ClientId != op.End.ClientId {
			return fmt.Errorf("%w: end of %q without its start", ErrBadRecord, op.End.Key)
		}
		p := o.Pending
		o.Replicas, o.Size, o.Checksum, o.Writer, o.HardPin, o.Pending = p.Replicas, p.Size, op.End.Checksum, p.ClientId, p.HardPin, nil
	case *storepb.JournalRecord_Commit:
		c := op.Commit
		so := st.objects[c.Slot]
		if so == nil || so.Pending == nil || so.Pending.ClientId != c.ClientId || c.Key == c.Slot {
			return fmt.Errorf("%w: commit of slot %q without its start", ErrBadRecord, c.Slot)
		}
		p := so.Pending
		so.Pending = nil
		if len(so.Replicas) == 0 {
			delete(st.objects, c.Slot)
		}
		o := st.objects[c.Key]
		if o == nil {
			o = &storepb.ObjectState{Key: c.Key}
			st.objects[c.Key] = o
		}
		o.Replicas, o.Size, o.Checksum, o.Writer, o.HardPin, o.Pending = p.Replicas, p.Size, c.Checksum, p.ClientId, p.HardPin, nil
	case *storepb.JournalRecord_Revoke:
		if o := st.objects[op.Revoke.Key]; o != nil {
			o.Pending = nil
			if len(o.Replicas) == 0 {
				delete(st.objects, op.Revoke.Key)
			}
		}
	case *storepb.JournalRecord_Drop:
		if o := st.objects[op.Drop.Key]; o != nil {
			switch {
			case op.Drop.DramOnly:
				o.Replicas = slices.DeleteFunc(o.Replicas, func(l *storepb.ReplicaLocation) bool { return !st.onDisk(l) })
			case op.Drop.DiskOnly:
				o.Replicas = slices.DeleteFunc(o.Replicas, st.onDisk)
			default:
				o.Replicas = nil
			}
			if o.Pending == nil && len(o.Replicas) == 0 {
				delete(st.objects, op.Drop.Key)
			}
		}
	case *storepb.JournalRecord_MoveStart:
		m := op.MoveStart
		if m.Id == 0 || m.To == nil {
			return fmt.Errorf("%w: move start without an id or a target", ErrBadRecord)
		}
		st.moves[m.Id] = m
		st.lastMoveID = max(st.lastMoveID, m.Id)
	case *storepb.JournalRecord_MoveAbort:
		delete(st.moves, op.MoveAbort.Id)
	case *storepb.JournalRecord_Drain:
		d := op.Drain
		if d.Id == "" {
			return fmt.Errorf("%w: drain job without an id", ErrBadRecord)
		}
		st.drains[d.Id] = d
		// The job's segments, as startDrain and stepDrain (or a cancel)
		// set them on the leader.
		switch d.Status {
		case jobCreated:
			st.setDrain(d.SegmentIds, segDraining, func(uint32) bool { return true })
		case jobSucceeded:
			st.setDrain(d.SegmentIds, segDrained, func(was uint32) bool { return was == segDraining })
		case jobFailed, jobCanceled:
			st.setDrain(d.SegmentIds, 0, func(was uint32) bool { return was == segDraining })
		}
	case *storepb.JournalRecord_Move:
		mv := op.Move
		delete(st.moves, mv.Id) // its target is the replica's now
		o := st.objects[mv.Key]
		if o == nil || mv.From == nil || mv.To == nil {
			return fmt.Errorf("%w: move of %q without the object", ErrBadRecord, mv.Key)
		}
		switch {
		case mv.KeepFrom:
		case mv.OnlyFrom:
			// A drain's move: the source, a replica or a piece, left for
			// the target; the other replicas stay.
			o.Replicas = moveLoc(o.Replicas, mv.From, mv.To, !st.unmounted(mv.To))
			return nil
		default:
			// A spill: the object left DRAM.
			o.Replicas = slices.DeleteFunc(o.Replicas, func(l *storepb.ReplicaLocation) bool { return !st.onDisk(l) })
		}
		if !st.unmounted(mv.To) {
			o.Replicas = append(o.Replicas, mv.To)
		}
	default:
		return fmt.Errorf("%w: record of unknown kind %T", ErrBadRecord, rec.Op)
	}
	return nil
}

// setDrain sets the drain status of the segments of ids that are mounted
// and whose status passes from.
func (st *state) setDrain(ids []string, to uint32, from func(uint32) bool) {
	for _, id := range ids {
		if m := st.segs[id]; m != nil && from(m.Drain) && m.Drain != to {
			m = proto.CloneOf(m) // records are shared: the state changes copies
			m.Drain = to
			st.segs[id] = m
		}
	}
}

// unmountClient takes the segments of clientID, expired, out of the state
// and returns their ids.
func (st *state) unmountClient(clientID string) map[string]bool {
	gone := map[string]bool{}
	for id, m := range st.segs {
		if m.ClientId == clientID {
			delete(st.segs, id)
			gone[id] = true
		}
	}
	return gone
}

// dropOn drops the replicas on the segments gone, as the leader's sweep
// of the dead segments did: a segment mounted again with the same id (a
// client the master expired, back after a long pause) holds none of them.
// Objects left without replicas stay until restore, as records after this
// one may still name them (the leader's sweep ran after its record).
// Objects whose keys skip reports true are left alone (nil: none is).
// Move targets on them go: their space went with the segment.
func (st *state) dropOn(gone map[string]bool, skip func(key string) bool) {
	if len(gone) == 0 {
		return
	}
	on := func(l *storepb.ReplicaLocation) bool {
		return slices.ContainsFunc(pieceLocs(l), func(p *storepb.ReplicaLocation) bool { return gone[p.SegmentId] })
	}
	maps.DeleteFunc(st.moves, func(_ uint64, m *storepb.JournalMoveStart) bool { return on(m.To) })
	for key, o := range st.objects {
		if skip != nil && skip(key) {
			continue
		}
		o.Replicas = slices.DeleteFunc(o.Replicas, on)
		if o.Pending != nil {
			o.Pending.Replicas = slices.DeleteFunc(o.Pending.Replicas, on)
		}
	}
}

// unmounted reports whether l's segment is not mounted at this point of
// the journal: its unmount was recorded after the space was taken, before
// the record naming it, and the leader's sweep dropped it (dropOn).
func (st *state) unmounted(l *storepb.ReplicaLocation) bool {
	return slices.ContainsFunc(pieceLocs(l), func(p *storepb.ReplicaLocation) bool { return st.segs[p.SegmentId] == nil })
}

// onDisk reports whether l is on an SSD tier; replicas on segments
// unmounted meanwhile count as DRAM (they are dropped on restore anyway).
func (st *state) onDisk(l *storepb.ReplicaLocation) bool {
	m := st.segs[l.SegmentId]
	return m != nil && m.Segment.GetMedium() == storepb.Medium_MEDIUM_DISK
}

// restore replaces the service's state with st, as a new leader does
// before it serves. Replicas on segments no longer mounted are dropped.
// Every object gets a lease of LeaseTTL, since readers of the old leader
// may still be copying it, and every known client a fresh TTL. Puts in
// flight stay in flight: their writers may still end them.
func (s *Service) restore(st *state) error {
	now := s.now()
	used := make(map[string][]alloc.Span)
	var bad error
	keep := func(locs []*storepb.ReplicaLocation) []*storepb.ReplicaLocation {
		out := locs[:0:0]
		for _, l := range locs {
			if err := checkLoc(l); err != nil {
				bad = err
			}
			if !st.unmounted(l) {
				out = append(out, l)
				for _, p := range pieceLocs(l) {
					used[p.SegmentId] = append(used[p.SegmentId], alloc.Span{Off: p.Offset, Size: p.Size})
				}
			}
		}
		return out
	}
	for key, o := range st.objects {
		o.Replicas = keep(o.Replicas)
		if o.Pending != nil {
			if o.Pending.Replicas = keep(o.Pending.Replicas); len(o.Pending.Replicas) == 0 {
				o.Pending = nil
			}
		}
		if len(o.Replicas) == 0 && o.Pending == nil {
			delete(st.objects, key)
		}
	}
	for id, m := range st.moves {
		if len(keep([]*storepb.ReplicaLocation{m.To})) == 0 {
			delete(st.moves, id)
		}
	}
	if bad != nil {
		return bad
	}

	s.segMu.Lock()
	defer s.segMu.Unlock()
	s.segs, s.segList, s.clients, s.deferred = make(map[string]*segment), nil, make(map[string]*client), nil
	s.tasks, s.nextTask = make(map[uint64]*moveTask), max(s.nextTask, st.lastMoveID)
	s.diskTiers.Store(0)
	for id, m := range st.segs {
		a, err := alloc.Restore(m.Segment.Size, used[id])
		if err != nil {
			return fmt.Errorf("master: restore segment %s: %w", id, err)
		}
		sg := newSegment(m.ClientId, m.Segment, a, len(s.segList))
		if m.HeldUntilUnixMs != 0 {
			sg.heldUntil = time.UnixMilli(m.HeldUntilUnixMs) // heldLocked ends a hold past
		}
		if sg.medium == storepb.Medium_MEDIUM_DRAM && (m.Drain == segDraining || m.Drain == segDrained) {
			sg.drain = uint8(m.Drain)
		}
		s.segs[id] = sg
		s.segList = append(s.segList, sg)
		if sg.medium == storepb.Medium_MEDIUM_DISK {
			s.diskTiers.Add(1)
		}
		c := s.touchLocked(m.ClientId)
		c.segs[id] = sg
		if sg.hostID != "" {
			c.hostID = sg.hostID
		}
	}
	var reps func(locs []*storepb.ReplicaLocation) []replica
	reps = func(locs []*storepb.ReplicaLocation) []replica {
		out := make([]replica, len(locs))
		for i, l := range locs {
			out[i] = replica{seg: s.segs[l.SegmentId], off: l.Offset, size: l.Size}
			if len(l.Stripes) > 0 {
				out[i].stripes = reps(l.Stripes)
			}
		}
		return out
	}
	// A move the last leader handed out may still be copying into its
	// target: the target stays taken until the client reports (the object
	// is not told: its move ends as one whose object went, orphanLocked)
	// or the move expires.
	for id, m := range st.moves {
		s.tasks[id] = &moveTask{id: id, key: m.Key, dst: reps([]*storepb.ReplicaLocation{m.To})[0],
			client: m.ClientId, created: now, handed: true, journaled: true}
	}
	// Drain jobs go on (planned on the monitor's next tick), their
	// segments DRAINING as restored above.
	s.restoreDrainsLocked(st.drains)
	for i := range s.shards {
		s.shards[i].mu.Lock()
		clear(s.shards[i].objects)
		s.shards[i].order.clear()
		s.shards[i].mu.Unlock()
	}
	for key, o := range st.objects {
		obj := &object{size: o.Size, checksum: o.Checksum, replicas: reps(o.Replicas), writer: o.Writer,
			hardPin: o.HardPin, lease: now.Add(s.cfg.LeaseTTL)}
		dramFirst(obj.replicas)
		if p := o.Pending; p != nil {
			obj.pending = &pendingPut{client: p.ClientId, started: now, size: p.Size, replicas: reps(p.Replicas),
				cfg: &storepb.ReplicateConfig{WithHardPin: p.HardPin}, upsert: p.Upsert}
		}
		sh := s.shardOf(key)
		sh.mu.Lock()
		sh.objects[key] = obj
		s.reorderLocked(sh, key, obj) // the eviction order, rebuilt
		sh.mu.Unlock()
	}
	return nil
}

// snapshot captures the durable state as of the returned sequence number
// (snapshotShards), or, should that fail, with every shard and segMu
// held. Objects go into chunks of at most perChunk.
func (s *Service) snapshot(perChunk int) (chunks []*storepb.SnapshotChunk, seq uint64) {
	if st, seq, err := s.snapshotShards(); err == nil {
		return st.chunks(perChunk), seq
	}
	return s.snapshotLocked(perChunk)
}

// snapshotShardCopied, when not nil, runs after a snapshot copied shard i
// and before the next: tests change the state there.
var snapshotShardCopied func(i int)

// snapshotPasses bounds the rounds of copying keys again that a snapshot
// makes before it falls back to holding every lock (snapshotShards).
const snapshotPasses = 16

// snapshotShards captures the durable state as of a sequence number
// without holding every shard at once, which stalled every request for
// the whole copy (tens of milliseconds per 100000 objects). The segments
// are copied at record from, then each shard under its own lock at the
// record then last (at[i]): a shard's keys change, and their records are
// appended, only under its lock, so the copy is exactly its keys' state
// as of at[i]. The records appended meanwhile (the tap) then bring every
// part up to the last of those, seq: each record is applied to the parts
// copied before it. A commit moves a reserved slot's value to a key of
// another shard; one whose slot was copied after it but key before
// cannot be applied (the slot's start is gone), so that key is copied
// again, later.
func (s *Service) snapshotShards() (*state, uint64, error) {
	st := newState()
	if s.j == nil {
		for i := range s.shards {
			s.copyShard(st, i, nil)
		}
		return st, 0, nil
	}
	tap, ok := s.j.(tapper)
	if !ok {
		return nil, 0, errors.New("master: snapshot: the journal does not hand out its records")
	}
	s.segMu.Lock()
	from, ok := tap.startTap()
	if !ok {
		s.segMu.Unlock()
		return nil, 0, errors.New("master: snapshot: another one is running")
	}
	for _, sg := range s.segList {
		st.segs[sg.id] = mountOf(sg)
	}
	st.lastMoveID = s.movesLocked(st.moves)
	s.drainRecords(st.drains) // records appended after from replace them
	s.segMu.Unlock()
	defer tap.stopTap()

	at := make([]uint64, len(s.shards)) // each shard's copy is as of record at[i]
	again := map[string]uint64{}        // keys copied again, as of
	seq := from
	for i := range s.shards {
		at[i] = s.copyShard(st, i, nil)
		seq = max(seq, at[i])
		if snapshotShardCopied != nil {
			snapshotShardCopied(i)
		}
	}
	copied := func(key string, rec uint64) bool {
		n, ok := again[key]
		if !ok {
			n = at[s.shardIndex(key)]
		}
		return rec <= n
	}
	for pass := 0; ; pass++ {
		recs := tap.tapThrough(seq)
		var split []string
		for _, r := range recs {
			if c := r.rec.GetCommit(); c != nil && c.Slot != c.Key && copied(c.Slot, r.seq) && !copied(c.Key, r.seq) {
				split = append(split, c.Key)
			}
		}
		if len(split) == 0 {
			for _, r := range recs {
				if err := st.applyAfter(proto.Clone(r.rec).(*storepb.JournalRecord), r.seq, copied); err != nil {
					return nil, 0, fmt.Errorf("master: snapshot: record %d: %w", r.seq, err)
				}
			}
			return st, seq, nil
		}
		if pass == snapshotPasses {
			return nil, 0, fmt.Errorf("master: snapshot: commits across shards still split after %d passes", pass)
		}
		for _, key := range split {
			n := s.copyShard(st, int(s.shardIndex(key)), []string{key})
			again[key] = n
			seq = max(seq, n)
		}
	}
}

// copyShard copies shard i's objects (only those of keys, when not nil)
// into st under the shard's lock, and returns the record they are as of.
// The record is read under segMu too: every segment unmounted up to it is
// marked dead, and none after, so the replicas left out as dead (live)
// are those its unmounts dropped; a segment unmounted during the copy is
// dropped again by its record.
func (s *Service) copyShard(st *state, i int, keys []string) uint64 {
	sh := &s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var seq uint64
	if s.j != nil {
		s.segMu.Lock()
		seq = s.j.last()
		s.segMu.Unlock()
	}
	if keys == nil {
		for key, o := range sh.objects {
			st.objects[key] = objectState(key, o)
		}
		return seq
	}
	for _, key := range keys {
		if o := sh.objects[key]; o != nil {
			st.objects[key] = objectState(key, o)
		} else {
			delete(st.objects, key)
		}
	}
	return seq
}

// applyAfter applies record seq to the parts of st copied before it:
// segments always (they were copied first), and objects whose keys were
// copied as of an earlier record (copied reports false).
func (st *state) applyAfter(rec *storepb.JournalRecord, seq uint64, copied func(key string, seq uint64) bool) error {
	skip := func(key string) bool { return copied(key, seq) }
	switch op := rec.Op.(type) {
	case *storepb.JournalRecord_Mount:
		return st.apply(rec)
	case *storepb.JournalRecord_Unmount:
		delete(st.segs, op.Unmount.SegmentId)
		st.dropOn(map[string]bool{op.Unmount.SegmentId: true}, skip)
		return nil
	case *storepb.JournalRecord_Expire:
		st.dropOn(st.unmountClient(op.Expire.ClientId), skip)
		return nil
	case *storepb.JournalRecord_Commit:
		c := op.Commit
		switch slot, key := skip(c.Slot), skip(c.Key); {
		case slot && key:
			return nil
		case key:
			// The key was copied with the value; the slot still holds it.
			if so := st.objects[c.Slot]; so != nil {
				so.Pending = nil
				if len(so.Replicas) == 0 {
					delete(st.objects, c.Slot)
				}
			}
			return nil
		case slot:
			return fmt.Errorf("%w: commit of slot %q to %q split across the copy", ErrBadRecord, c.Slot, c.Key)
		}
		return st.apply(rec)
	}
	if mv := rec.GetMove(); mv != nil {
		// The moves were copied with the segments, before any shard.
		delete(st.moves, mv.Id)
	}
	if key := recordKey(rec); key != "" && skip(key) {
		return nil
	}
	return st.apply(rec)
}

// recordKey is the key a record of one object changes ("" for others).
func recordKey(rec *storepb.JournalRecord) string {
	switch op := rec.Op.(type) {
	case *storepb.JournalRecord_Start:
		return op.Start.GetKey()
	case *storepb.JournalRecord_End:
		return op.End.GetKey()
	case *storepb.JournalRecord_Revoke:
		return op.Revoke.GetKey()
	case *storepb.JournalRecord_Drop:
		return op.Drop.GetKey()
	case *storepb.JournalRecord_Move:
		return op.Move.GetKey()
	}
	return ""
}

// mountOf is sg's mount record, with its hold after a remount. segMu is
// held.
func mountOf(sg *segment) *storepb.JournalMount {
	m := &storepb.JournalMount{ClientId: sg.client, Segment: &storepb.Segment{
		Id: sg.id, Name: sg.name, Base: sg.base, Size: sg.size, TransportEndpoint: sg.endpoint, HostId: sg.hostID,
		Protocol: "tcp", Medium: sg.medium,
	}}
	if !sg.heldUntil.IsZero() {
		m.HeldUntilUnixMs = sg.heldUntil.UnixMilli()
	}
	m.Drain = uint32(sg.drain)
	return m
}

// movesLocked adds the moves whose targets are journaled, on segments not
// being unmounted, to moves, and returns the highest move id handed out
// (every id a record may name is at most that). segMu is held.
func (s *Service) movesLocked(moves map[uint64]*storepb.JournalMoveStart) uint64 {
	for _, t := range s.tasks {
		if t.journaled && !t.dst.dead() {
			moves[t.id] = t.startRecord().GetMoveStart()
		}
	}
	return s.nextTask
}

// objectState is o, of key, as a snapshot holds it. Replicas on segments
// unmounted but not swept yet are left out, as the sweep will drop them:
// the segment may be mounted again, same id, in the records after.
func objectState(key string, o *object) *storepb.ObjectState {
	os := &storepb.ObjectState{Key: key, Size: o.size, Checksum: o.checksum, Replicas: locations(live(o.replicas)),
		Writer: o.writer, HardPin: o.hardPin}
	if p := o.pending; p != nil {
		lp := *p
		lp.replicas = live(p.replicas)
		os.Pending = startRecord(p.client, key, &lp).GetStart()
	}
	return os
}

// chunks is st as snapshot chunks: the segments, then the objects, at
// most perChunk a chunk.
func (st *state) chunks(perChunk int) []*storepb.SnapshotChunk {
	first := &storepb.SnapshotChunk{LastMoveId: st.lastMoveID, Drains: slices.Collect(maps.Values(st.drains))}
	for _, m := range st.segs {
		first.Segments = append(first.Segments, m)
	}
	chunks := []*storepb.SnapshotChunk{first}
	cur := first
	for _, o := range st.objects {
		if len(cur.Objects) >= perChunk {
			cur = &storepb.SnapshotChunk{}
			chunks = append(chunks, cur)
		}
		cur.Objects = append(cur.Objects, o)
	}
	return addMoves(chunks, slices.Collect(maps.Values(st.moves)), perChunk)
}

// addMoves puts moves into chunks, filling the last one up to perChunk
// objects and moves together and adding more as needed.
func addMoves(chunks []*storepb.SnapshotChunk, moves []*storepb.JournalMoveStart, perChunk int) []*storepb.SnapshotChunk {
	cur := chunks[len(chunks)-1]
	for _, m := range moves {
		if len(cur.Objects)+len(cur.Moves) >= perChunk {
			cur = &storepb.SnapshotChunk{}
			chunks = append(chunks, cur)
		}
		cur.Moves = append(cur.Moves, m)
	}
	return chunks
}

// snapshotLocked captures the durable state with every shard and segMu
// held, so no record is being appended: the state is exactly that of the
// records up to the returned sequence number.
func (s *Service) snapshotLocked(perChunk int) (chunks []*storepb.SnapshotChunk, seq uint64) {
	for i := range s.shards {
		s.shards[i].mu.Lock()
	}
	s.segMu.Lock()
	if s.j != nil {
		seq = s.j.last()
	}
	first := &storepb.SnapshotChunk{}
	for _, sg := range s.segList {
		first.Segments = append(first.Segments, mountOf(sg))
	}
	moves := make(map[uint64]*storepb.JournalMoveStart)
	first.LastMoveId = s.movesLocked(moves)
	drains := make(map[string]*storepb.JournalDrain)
	s.drainRecords(drains)
	first.Drains = slices.Collect(maps.Values(drains))
	s.segMu.Unlock()
	chunks = append(chunks, first)
	cur := first
	for i := range s.shards {
		for key, o := range s.shards[i].objects {
			if len(cur.Objects) >= perChunk {
				cur = &storepb.SnapshotChunk{}
				chunks = append(chunks, cur)
			}
			cur.Objects = append(cur.Objects, objectState(key, o))
		}
		s.shards[i].mu.Unlock()
	}
	return addMoves(chunks, slices.Collect(maps.Values(moves)), perChunk), seq
}

// loadChunk adds a snapshot chunk to st. A segment, move or drain job the
// chunk holds without its id (or a move without its target) is an error,
// as the same record would be in the log: a damaged snapshot is noticed,
// not restored into a master.
func (st *state) loadChunk(c *storepb.SnapshotChunk) error {
	for _, m := range c.Segments {
		if m.GetSegment().GetId() == "" {
			return fmt.Errorf("%w: snapshot of a segment without its id", ErrBadRecord)
		}
	}
	for _, m := range c.Moves {
		if m.Id == 0 || m.To == nil {
			return fmt.Errorf("%w: snapshot of a move without an id or a target", ErrBadRecord)
		}
	}
	for _, d := range c.Drains {
		if d.Id == "" {
			return fmt.Errorf("%w: snapshot of a drain job without an id", ErrBadRecord)
		}
	}
	for _, m := range c.Segments {
		st.segs[m.Segment.Id] = m
	}
	for _, m := range c.Moves {
		st.moves[m.Id] = m
		st.lastMoveID = max(st.lastMoveID, m.Id) // as apply: no new move takes its id
	}
	for _, d := range c.Drains {
		st.drains[d.Id] = d
	}
	st.lastMoveID = max(st.lastMoveID, c.LastMoveId)
	for _, o := range c.Objects {
		st.objects[o.Key] = o
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

package master

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
	snapSeq uint64 // the snapshot the state was loaded from (0: none)
}

func newState() *state {
	return &state{segs: make(map[string]*storepb.JournalMount), objects: make(map[string]*storepb.ObjectState)}
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
		st.dropOn(map[string]bool{op.Unmount.SegmentId: true})
	case *storepb.JournalRecord_Expire:
		gone := map[string]bool{}
		for id, m := range st.segs {
			if m.ClientId == op.Expire.ClientId {
				delete(st.segs, id)
				gone[id] = true
			}
		}
		st.dropOn(gone)
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
	case *storepb.JournalRecord_Move:
		mv := op.Move
		o := st.objects[mv.Key]
		if o == nil || mv.From == nil || mv.To == nil {
			return fmt.Errorf("%w: move of %q without the object", ErrBadRecord, mv.Key)
		}
		switch {
		case mv.KeepFrom:
		case mv.OnlyFrom:
			// A drain's move: the source left, the other replicas stay.
			o.Replicas = slices.DeleteFunc(o.Replicas, func(l *storepb.ReplicaLocation) bool {
				return l.SegmentId == mv.From.SegmentId && l.Offset == mv.From.Offset
			})
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

// dropOn drops the replicas on the segments gone, as the leader's sweep
// of the dead segments did: a segment mounted again with the same id (a
// client the master expired, back after a long pause) holds none of them.
// Objects left without replicas stay until restore, as records after this
// one may still name them (the leader's sweep ran after its record).
func (st *state) dropOn(gone map[string]bool) {
	if len(gone) == 0 {
		return
	}
	on := func(l *storepb.ReplicaLocation) bool { return gone[l.SegmentId] }
	for _, o := range st.objects {
		o.Replicas = slices.DeleteFunc(o.Replicas, on)
		if o.Pending != nil {
			o.Pending.Replicas = slices.DeleteFunc(o.Pending.Replicas, on)
		}
	}
}

// unmounted reports whether l's segment is not mounted at this point of
// the journal: its unmount was recorded after the space was taken, before
// the record naming it, and the leader's sweep dropped it (dropOn).
func (st *state) unmounted(l *storepb.ReplicaLocation) bool { return st.segs[l.SegmentId] == nil }

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
	keep := func(locs []*storepb.ReplicaLocation) []*storepb.ReplicaLocation {
		out := locs[:0:0]
		for _, l := range locs {
			if _, ok := st.segs[l.SegmentId]; ok {
				out = append(out, l)
				used[l.SegmentId] = append(used[l.SegmentId], alloc.Span{Off: l.Offset, Size: l.Size})
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

	s.segMu.Lock()
	defer s.segMu.Unlock()
	s.segs, s.segList, s.clients, s.deferred = make(map[string]*segment), nil, make(map[string]*client), nil
	s.diskTiers = 0
	for id, m := range st.segs {
		a, err := alloc.Restore(m.Segment.Size, used[id])
		if err != nil {
			return fmt.Errorf("master: restore segment %s: %w", id, err)
		}
		sg := newSegment(m.ClientId, m.Segment, a, len(s.segList))
		s.segs[id] = sg
		s.segList = append(s.segList, sg)
		if sg.medium == storepb.Medium_MEDIUM_DISK {
			s.diskTiers++
		}
		c := s.touchLocked(m.ClientId)
		c.segs[id] = sg
		if sg.hostID != "" {
			c.hostID = sg.hostID
		}
	}
	reps := func(locs []*storepb.ReplicaLocation) []replica {
		out := make([]replica, len(locs))
		for i, l := range locs {
			out[i] = replica{seg: s.segs[l.SegmentId], off: l.Offset, size: l.Size}
		}
		return out
	}
	for i := range s.shards {
		s.shards[i].mu.Lock()
		clear(s.shards[i].objects)
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
		sh.mu.Unlock()
	}
	return nil
}

// snapshot captures the durable state with every shard and segMu held, so
// no record is being appended: the state is exactly that of the records up
// to the returned sequence number. Objects go into chunks of at most
// perChunk.
func (s *Service) snapshot(perChunk int) (chunks []*storepb.SnapshotChunk, seq uint64) {
	for i := range s.shards {
		s.shards[i].mu.Lock()
	}
	s.segMu.Lock()
	if s.j != nil {
		seq = s.j.last()
	}
	first := &storepb.SnapshotChunk{}
	for _, sg := range s.segList {
		first.Segments = append(first.Segments, &storepb.JournalMount{ClientId: sg.client, Segment: &storepb.Segment{
			Id: sg.id, Name: sg.name, Base: sg.base, Size: sg.size, TransportEndpoint: sg.endpoint, HostId: sg.hostID,
			Protocol: "tcp", Medium: sg.medium,
		}})
	}
	s.segMu.Unlock()
	chunks = append(chunks, first)
	cur := first
	for i := range s.shards {
		for key, o := range s.shards[i].objects {
			if len(cur.Objects) >= perChunk {
				cur = &storepb.SnapshotChunk{}
				chunks = append(chunks, cur)
			}
			// Replicas on segments unmounted but not swept yet are left
			// out, as the sweep will drop them: the segment may be
			// mounted again, same id, in the records after seq.
			os := &storepb.ObjectState{Key: key, Size: o.size, Checksum: o.checksum, Replicas: locations(live(o.replicas)),
				Writer: o.writer, HardPin: o.hardPin}
			if p := o.pending; p != nil {
				lp := *p
				lp.replicas = live(p.replicas)
				os.Pending = startRecord(p.client, key, &lp).GetStart()
			}
			cur.Objects = append(cur.Objects, os)
		}
		s.shards[i].mu.Unlock()
	}
	return chunks, seq
}

// loadChunk adds a snapshot chunk to st.
func (st *state) loadChunk(c *storepb.SnapshotChunk) {
	for _, m := range c.Segments {
		st.segs[m.Segment.GetId()] = m
	}
	for _, o := range c.Objects {
		st.objects[o.Key] = o
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

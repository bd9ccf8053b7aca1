package master

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The SSD tier. A node with an SSD directory mounts a second segment of
// medium DISK: a preallocated file mapped into its memory and registered
// with its engine, so replicas there are read like DRAM ones (the kernel
// pages them in). Puts never land there.
//
// Moves are copies the master asks the owner of the source replica to make
// (in that client's next ping answer), reported back with MoveEnd:
//   - offload: when a put ends and a tier has room, its DRAM replica is
//     copied to SSD in the background (Mooncake's enable_offload), so that
//     evicting the object later only drops the DRAM replica, at once;
//   - spill: eviction of an object with no SSD copy yet moves it to SSD
//     (the DRAM replicas are freed when the copy is done);
//   - promotion: a read of an object only on SSD copies it back to DRAM.
//
// Until a move ends the object keeps the replicas it had. A put that finds
// no room evicts at once: objects without an SSD copy are then dropped, as
// without a tier. The tiers have their own watermark eviction (least
// recently used SSD copies go first), so a full tier keeps taking new
// objects; while one is full, evictions degrade to plain drops. Bytes on
// SSD carry the object's checksum like any replica, so a failing disk
// gives read errors, never wrong bytes.
//
// With a journal, a move's target is journaled before the ping hands the
// move out, and its end (done or given up) when it ends: a next leader
// keeps the space a copy may still be writing into from new puts, as a
// move whose object went (orphanLocked), until the client reports or the
// move expires.

// moveTaskTTL bounds how long a move may take before its target space is
// reclaimed and the object may be moved again.
const moveTaskTTL = 30 * time.Second

// maxTasksPerPing bounds the moves one ping answer carries; the client
// asks again at once while there are more.
const maxTasksPerPing = 256

// taskRecordWait bounds how long a ping waits for the records of the moves
// it hands out: a slow journal delays moves, not the client's heartbeat.
const taskRecordWait = 500 * time.Millisecond

// moveTask is an offload or spill (src DRAM -> dst SSD) or a promotion
// (src SSD -> dst DRAM) in flight.
type moveTask struct {
	id      uint64
	key     string
	o       *object // nil once the object is gone (orphaned task)
	src     replica
	dst     replica
	spill   bool   // the DRAM replicas go once the copy is done
	freeing uint64 // a spill's DRAM bytes, counted in Service.spilling
	client  string // owner of src: who copies
	created time.Time
	handed  bool
	// journaled: handed out with a JournalMoveStart, so that a next leader
	// keeps dst taken too; its end is journaled (moveEndID, abortLocked).
	journaled bool
	drain     *drainJob // a drain's move (admin_drain.go): src leaves once copied
}

// moveEndID is the id a JournalMove ending t carries: its own when its
// start was journaled, else 0.
func (t *moveTask) moveEndID() uint64 {
	if t.journaled {
		return t.id
	}
	return 0
}

// startRecord is t's JournalMoveStart.
func (t *moveTask) startRecord() *storepb.JournalRecord {
	return &storepb.JournalRecord{Op: &storepb.JournalRecord_MoveStart{MoveStart: &storepb.JournalMoveStart{
		Id: t.id, ClientId: t.client, Key: t.key, To: locations([]replica{t.dst})[0]}}}
}

// abortLocked gives t's target back and journals that, when t's start was
// journaled: a next leader frees it too. The record goes before any use of
// the space could be journaled, so whatever a new leader knows of that use
// it knows of the abort. segMu is held.
func (s *Service) abortLocked(t *moveTask) {
	s.freeLocked([]replica{t.dst})
	if t.journaled {
		s.record(&storepb.JournalRecord{Op: &storepb.JournalRecord_MoveAbort{MoveAbort: &storepb.JournalMoveAbort{Id: t.id}}})
	}
}

func (t *moveTask) proto() *storepb.MoveTask {
	return &storepb.MoveTask{Id: t.id, Key: t.key, Source: t.src.memory(), Target: t.dst.memory()}
}

// dramFirst orders reps DRAM before SSD, stably: readers and eviction
// look at replicas[0], disk eviction at the last.
func dramFirst(reps []replica) {
	slices.SortStableFunc(reps, func(a, b replica) int { return cmp.Compare(b2i(a.onDisk()), b2i(b.onDisk())) })
}

// take removes o's replicas on SSD (disk) or in DRAM (!disk) and returns
// them.
func (o *object) take(disk bool) []replica {
	var gone []replica
	o.replicas = slices.DeleteFunc(o.replicas, func(r replica) bool {
		if r.onDisk() == disk {
			gone = append(gone, r)
			return true
		}
		return false
	})
	return gone
}

// evictLocked evicts o's DRAM replicas and returns the DRAM bytes that
// frees (now, or once a spill ends). sh.mu is held.
func (s *Service) evictLocked(sh *shard, key string, o *object, force bool) uint64 {
	var dram uint64
	hasDisk := false
	for _, r := range o.replicas {
		if r.onDisk() {
			hasDisk = true
		} else {
			dram += r.size
		}
	}
	if hasDisk {
		// An SSD copy stays readable: drop only the DRAM replicas.
		media := s.kvMediaOf(o.replicas)
		gone := o.take(false)
		s.reorderLocked(sh, key, o) // only on SSD now
		s.kvChange(key, media, s.kvMediaOf(o.replicas), false)
		s.freeAfter(&storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: key, DramOnly: true}}}, gone)
		s.evictedKeys.Add(1)
		s.evictedBytes.Add(dram)
		return dram
	}
	// A forced eviction (a put found no room) needs the space now.
	if !force && o.moving == nil && s.startSpillLocked(key, o) {
		return dram
	}
	s.orphanLocked(o)
	n := s.dropLocked(sh, key, o, storepb.ObjectEventKind_OBJECT_EVENT_KIND_EVICTED)
	s.evictedKeys.Add(1)
	s.evictedBytes.Add(n)
	return n
}

// startSpillLocked queues the spill of o's first DRAM replica to an SSD
// tier, preferring the tier of the replica's owner (the copy stays on one
// machine). It reports whether a spill was queued. sh.mu is held.
func (s *Service) startSpillLocked(key string, o *object) bool {
	src := o.replicas[0]
	if src.striped() {
		return false // striped values live in DRAM only: it evicts them
	}
	if s.diskTiers.Load() == 0 {
		return false // nowhere to spill to: without this, segMu per eviction
	}
	s.segMu.Lock()
	defer s.segMu.Unlock()
	if src.seg.dead.Load() {
		return false
	}
	dst, ok := s.allocDiskLocked(src.seg.client, src.size)
	if !ok {
		return false
	}
	t := s.newTaskLocked(key, o, src, dst, true)
	t.freeing = 0
	for _, r := range o.replicas {
		t.freeing += r.size
	}
	s.spilling += t.freeing
	return true
}

// offloadLocked queues the background copy of a new object's DRAM replica
// to an SSD tier, if there is one with room. sh.mu is held.
func (s *Service) offloadLocked(key string, o *object) {
	if s.diskTiers.Load() == 0 || o.moving != nil || len(o.replicas) == 0 || o.replicas[0].onDisk() || o.replicas[0].striped() {
		return
	}
	src := o.replicas[0]
	s.segMu.Lock()
	defer s.segMu.Unlock()
	if src.seg.dead.Load() {
		return
	}
	if dst, ok := s.allocDiskLocked(src.seg.client, src.size); ok {
		s.newTaskLocked(key, o, src, dst, false)
	}
}

// allocDiskLocked places size bytes on an SSD tier, the client's own first.
func (s *Service) allocDiskLocked(client string, size uint64) (replica, bool) {
	return s.allocOnLocked(storepb.Medium_MEDIUM_DISK, client, size)
}

// allocOnLocked places size bytes on a segment of medium m, client's own
// segments first (a move then stays on one machine). No eviction.
func (s *Service) allocOnLocked(m storepb.Medium, client string, size uint64) (replica, bool) {
	var segs []*segment
	for _, sg := range s.segList {
		if sg.medium == m && sg.drain == 0 && !s.heldLocked(sg) {
			segs = append(segs, sg)
		}
	}
	slices.SortStableFunc(segs, func(a, b *segment) int { return cmp.Compare(b2i(a.client != client), b2i(b.client != client)) })
	for _, sg := range segs {
		if off, ok := sg.alloc.Alloc(size); ok {
			return replica{seg: sg, off: off, size: size}, true
		}
	}
	return replica{}, false
}

func (s *Service) newTaskLocked(key string, o *object, src, dst replica, spill bool) *moveTask {
	s.nextTask++
	t := &moveTask{id: s.nextTask, key: key, o: o, src: src, dst: dst, spill: spill,
		client: src.seg.client, created: s.now()}
	s.tasks[t.id] = t
	o.moving = t
	s.reorderLocked(s.shardOf(key), key, o) // only a forced eviction takes it now
	return t
}

// promoteLocked queues the copy of an SSD-only object back into DRAM, on
// the SSD owner's own DRAM segment if it has room, else anywhere; without
// room it does nothing (a read never evicts). sh.mu is held.
func (s *Service) promoteLocked(key string, o *object) {
	if o.moving != nil || o.pending != nil || len(o.replicas) == 0 || !o.replicas[0].onDisk() {
		return
	}
	src := o.replicas[0]
	s.segMu.Lock()
	defer s.segMu.Unlock()
	if src.seg.dead.Load() {
		return
	}
	if dst, ok := s.allocOnLocked(storepb.Medium_MEDIUM_DRAM, src.seg.client, src.size); ok {
		s.newTaskLocked(key, o, src, dst, false)
		s.promo.admitted.Add(1)
	}
}

// orphanLocked detaches o's move: the object is going away. The task's
// target stays allocated until the client reports or the task expires, so
// a copy still running lands in space nobody else was given.
func (s *Service) orphanLocked(o *object) {
	if t := o.moving; t != nil {
		s.segMu.Lock()
		s.spilling -= min(s.spilling, t.freeing)
		t.freeing = 0
		t.o = nil
		s.segMu.Unlock()
		o.moving = nil
	}
}

// takeTasks returns the moves queued for clientID not handed out yet.
// With a journal each target is journaled first (JournalMoveStart) and
// handed out once that is durable: a next leader then keeps the space the
// client may be copying into from new puts, until the move ends or
// expires. Moves whose records did not land within taskRecordWait (the
// answer is a ping's) are handed out again later. A move whose source or
// target went with its segment is never handed out: it expires.
func (s *Service) takeTasks(ctx context.Context, clientID string) []*storepb.MoveTask {
	s.segMu.Lock()
	var (
		out    []*storepb.MoveTask
		handed []*moveTask
		seq    uint64
	)
	for _, t := range s.tasks {
		if t.client == clientID && !t.handed && t.o != nil && len(out) < maxTasksPerPing &&
			!t.src.dead() && !t.dst.dead() {
			t.handed = true
			if s.j != nil && !t.journaled {
				t.journaled = true
				s.record(t.startRecord())
			}
			handed = append(handed, t)
			out = append(out, t.proto())
		}
	}
	if len(handed) > 0 && s.j != nil {
		seq = s.j.last() // a move handed out again has its record before
	}
	s.segMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, taskRecordWait)
	defer cancel()
	if err := s.durable(ctx, seq); err != nil {
		s.segMu.Lock()
		for _, t := range handed {
			t.handed = false
		}
		s.segMu.Unlock()
		return nil
	}
	slices.SortFunc(out, func(a, b *storepb.MoveTask) int { return cmp.Compare(a.Id, b.Id) })
	return out
}

// MoveEnd ends move id of clientID: on success the target replica joins
// the object (a spill also drops the source); on failure, or if the object
// changed meanwhile, the target's space is freed.
func (s *Service) MoveEnd(ctx context.Context, clientID string, id uint64, ok bool) error {
	s.segMu.Lock()
	t := s.tasks[id]
	if t == nil || t.client != clientID {
		s.segMu.Unlock()
		return storeErr(storepb.ObjectNotFound, "move %d: unknown (expired, or not this client's)", id)
	}
	s.segMu.Unlock()
	sh := s.shardOf(t.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.segMu.Lock()
	delete(s.tasks, id)
	s.spilling -= min(s.spilling, t.freeing)
	t.freeing = 0
	o := t.o
	if o != nil {
		o.moving = nil
		s.reorderLocked(sh, t.key, o)
	}
	live := o != nil && sh.objects[t.key] == o && !t.dst.seg.dead.Load() &&
		slices.ContainsFunc(o.replicas, func(r replica) bool { return r.holds(t.src) })
	if !ok || !live {
		s.abortLocked(t)
		s.segMu.Unlock()
		s.promo.ended(t, ok)
		s.drainEnded(t, ok)
		if !ok {
			return nil
		}
		return storeErr(storepb.ObjectNotFound, "move %d: %q changed meanwhile", id, t.key)
	}
	s.segMu.Unlock()
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{
		Key: t.key, From: locations([]replica{t.src})[0], To: locations([]replica{t.dst})[0], KeepFrom: !t.spill,
		Id: t.moveEndID()}}}
	var seq uint64
	media := s.kvMediaOf(o.replicas)
	if t.drain != nil {
		seq = s.drainMovedLocked(t, o)
	} else if t.spill {
		// The object leaves DRAM: every DRAM replica goes, the SSD copy
		// serves.
		gone := o.take(false)
		o.replicas = append(o.replicas, t.dst)
		seq = s.freeAfter(rec, gone)
		s.spilled.Add(1)
	} else {
		o.replicas = append(o.replicas, t.dst)
		seq = s.record(rec)
		if t.dst.onDisk() {
			s.offloaded.Add(1)
		} else {
			s.promoted.Add(1)
			s.promo.bytes.Add(t.dst.size)
			s.tenants.grow(t.key, t.dst.size) // DRAM its tenant's quota did not admit
		}
	}
	dramFirst(o.replicas)
	s.reorderLocked(sh, t.key, o)
	s.kvChange(t.key, media, s.kvMediaOf(o.replicas), false)
	return s.durableUnlocked(ctx, sh, seq)
}

// durableUnlocked waits for seq with sh.mu released (and retaken).
func (s *Service) durableUnlocked(ctx context.Context, sh *shard, seq uint64) error {
	if s.j == nil || seq == 0 {
		return nil
	}
	sh.mu.Unlock()
	defer sh.mu.Lock()
	return s.durable(ctx, seq)
}

// expireTasks frees the targets of moves older than moveTaskTTL.
func (s *Service) expireTasks() {
	now := s.now()
	var stale []*moveTask
	s.segMu.Lock()
	for id, t := range s.tasks {
		if now.Sub(t.created) >= moveTaskTTL {
			delete(s.tasks, id)
			stale = append(stale, t)
		}
	}
	s.segMu.Unlock()
	for _, t := range stale {
		sh := s.shardOf(t.key)
		sh.mu.Lock()
		s.segMu.Lock()
		if t.o != nil && t.o.moving == t {
			t.o.moving = nil
			s.reorderLocked(sh, t.key, t.o)
		}
		s.spilling -= min(s.spilling, t.freeing)
		t.freeing = 0
		s.abortLocked(t)
		s.segMu.Unlock()
		sh.mu.Unlock()
		if t.promotion() {
			s.promo.expired.Add(1)
		}
	}
}

// evictDisk frees SSD tier space past the high watermark: SSD copies of
// objects, least recently used first, skipping leased objects and moves in
// flight; an object whose only copy goes is dropped.
func (s *Service) evictDisk(now time.Time) {
	s.segMu.Lock()
	capacity, used := s.usageLocked(storepb.Medium_MEDIUM_DISK)
	s.segMu.Unlock()
	if capacity == 0 || float64(used) <= s.cfg.EvictionHighWatermark*float64(capacity) {
		return
	}
	target := float64(used) - (s.cfg.EvictionHighWatermark-s.cfg.EvictionRatio)*float64(capacity)
	order := s.candidates(now, func(o *object) bool { return diskEvictable(o, now) }, diskBytes, target, &s.diskEvictBuf, 1)
	defer order.release()
	var freed float64
	for i := range order.len() {
		if freed >= target {
			return
		}
		c := order.at(i)
		c.sh.mu.Lock()
		if c.sh.objects[c.key] == c.o && diskEvictable(c.o, now) {
			media := s.kvMediaOf(c.o.replicas)
			gone := c.o.take(true)
			for _, r := range gone {
				freed += float64(r.size)
			}
			if len(c.o.replicas) == 0 {
				c.o.replicas = gone // dropLocked frees and journals them
				s.dropLocked(c.sh, c.key, c.o, storepb.ObjectEventKind_OBJECT_EVENT_KIND_EVICTED)
			} else {
				s.freeAfter(&storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: c.key, DiskOnly: true}}}, gone)
				s.reorderLocked(c.sh, c.key, c.o)
				s.kvChange(c.key, media, s.kvMediaOf(c.o.replicas), false)
			}
			s.evictedKeys.Add(1)
		}
		c.sh.mu.Unlock()
	}
}

// diskBytes is what evicting o's SSD copies frees.
func diskBytes(o *object) uint64 { return bytesOn(o, true) }

func diskEvictable(o *object, now time.Time) bool {
	return o.complete() && o.pending == nil && o.moving == nil && !o.hardPin && !o.lease.After(now) &&
		o.replicas[len(o.replicas)-1].onDisk() // SSD replicas come last
}

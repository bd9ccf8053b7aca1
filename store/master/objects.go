package master

import (
	"context"
	"regexp"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// replica is one copy of an object's full length: one allocation, or,
// striped, several on distinct segments (stripes, in order), which a
// reader moves in parallel. A striped replica's seg and off are its first
// piece's; size is always the whole length. Pieces are DRAM and have no
// stripes of their own. A replica's stripes are never changed in place
// (copies of it are handed out): a drain that moves a piece gives the
// replica a new list (withPiece).
type replica struct {
	seg       *segment
	off, size uint64
	stripes   []replica
}

// striped reports whether r is cut into pieces.
func (r replica) striped() bool { return len(r.stripes) > 0 }

// pieces calls f with each allocation of r, in order.
func (r replica) pieces(f func(p replica)) {
	if !r.striped() {
		f(r)
		return
	}
	for _, p := range r.stripes {
		f(p)
	}
}

// dead reports whether some piece of r is on an unmounted segment: the
// replica is lost.
func (r replica) dead() bool {
	if !r.striped() {
		return r.seg.dead.Load()
	}
	return slices.ContainsFunc(r.stripes, replica.dead)
}

// allDead reports whether every piece of r is on an unmounted segment:
// nothing of it is left to free.
func (r replica) allDead() bool {
	if !r.striped() {
		return r.seg.dead.Load()
	}
	for _, p := range r.stripes {
		if !p.seg.dead.Load() {
			return false
		}
	}
	return true
}

// on reports whether some piece of r is on segment sg.
func (r replica) on(sg *segment) bool {
	if !r.striped() {
		return r.seg == sg
	}
	return slices.ContainsFunc(r.stripes, func(p replica) bool { return p.seg == sg })
}

// is reports whether r and q are the same allocations.
func (r replica) is(q replica) bool {
	return r.seg == q.seg && r.off == q.off && r.size == q.size &&
		slices.EqualFunc(r.stripes, q.stripes, replica.is)
}

// holds reports whether piece p (one allocation) is r or one of its
// stripes.
func (r replica) holds(p replica) bool {
	if !r.striped() {
		return r.is(p)
	}
	return slices.ContainsFunc(r.stripes, p.is)
}

// withPiece is r with its piece from replaced by to (r itself when r is
// from): a drain's move of one piece. The stripes are copied.
func (r replica) withPiece(from, to replica) replica {
	if !r.striped() {
		return to
	}
	out := r
	out.stripes = slices.Clone(r.stripes)
	for i, p := range out.stripes {
		if p.is(from) {
			out.stripes[i] = to
		}
	}
	out.seg, out.off = out.stripes[0].seg, out.stripes[0].off
	return out
}

// object is the metadata of one key: its readable replicas, and the put or
// upsert in flight, if any.
type object struct {
	size     uint64
	checksum uint32
	replicas []replica // COMPLETE, DRAM first; empty while the first put is in flight
	pending  *pendingPut
	moving   *moveTask // a spill or promotion in flight
	writer   string    // the client whose put made replicas

	// lease orders eviction (oldest first) and, while in the future,
	// protects the object from Remove and eviction. PutEnd sets it to now.
	lease        time.Time
	hardPin      bool
	softPinUntil time.Time

	ev orderNode // its place in the eviction order (evict_order.go)
}

// pendingPut is a PutStart or UpsertStart awaiting its PutEnd.
type pendingPut struct {
	client   string
	started  time.Time
	size     uint64
	replicas []replica // PROCESSING
	cfg      *storepb.ReplicateConfig
	upsert   bool
}

func (o *object) complete() bool { return len(o.replicas) > 0 }
func (o *object) empty() bool    { return len(o.replicas) == 0 && o.pending == nil }

// deferredFree is a set of replaced replicas a reader may still hold a lease
// on; they are freed once the lease ends.
type deferredFree struct {
	at   time.Time
	reps []replica
}

// checkKey refuses an empty key and one over ServiceConfig.MaxKeyLen; the
// key checked is the client's, without its tenant (tenant.go).
func (s *Service) checkKey(key string) error {
	_, key = splitKey(key)
	switch {
	case key == "":
		return storeErr(storepb.InvalidParams, "empty key")
	// A slot's name is the master's (reserve.go), not held to the limit
	// of the keys it is made for.
	case len(key) > s.cfg.MaxKeyLen && !isSlot(key):
		return storeErr(storepb.InvalidParams, "key of %d bytes is over the limit of %d bytes (max_key_length)",
			len(key), s.cfg.MaxKeyLen)
	}
	return nil
}

// PutStart reserves space for a new object of length bytes: cfg.replica_num
// replicas (0 means 1) on distinct segments, best effort. The client writes
// them and calls PutEnd, or PutRevoke on failure. Puts are write-once: an
// existing object, or another client's PutStart younger than
// PutStartDiscardTimeout, gives ObjectAlreadyExists. When no replica fits,
// PutStart evicts once and retries before answering NoAvailableHandle.
func (s *Service) PutStart(ctx context.Context, clientID, key string, length uint64, cfg *storepb.ReplicateConfig) ([]*storepb.Replica, error) {
	return s.start(ctx, clientID, key, length, cfg, false)
}

// UpsertStart is PutStart that may replace an existing object. The old
// replicas stay readable until PutEnd swaps the new ones in; then they are
// freed, or, if a reader holds a lease, when that lease ends.
func (s *Service) UpsertStart(ctx context.Context, clientID, key string, length uint64, cfg *storepb.ReplicateConfig) ([]*storepb.Replica, error) {
	return s.start(ctx, clientID, key, length, cfg, true)
}

func (s *Service) start(ctx context.Context, clientID, key string, length uint64, cfg *storepb.ReplicateConfig, upsert bool) ([]*storepb.Replica, error) {
	reps, seq, err := s.startSeq(ctx, clientID, key, length, cfg, upsert)
	return s.started(ctx, reps, seq, err)
}

// startSeq is start without waiting for its journal record, whose sequence
// number it returns (a batch waits once for all its items), and with the
// live replicas, copies, not yet described.
func (s *Service) startSeq(ctx context.Context, clientID, key string, length uint64, cfg *storepb.ReplicateConfig, upsert bool) ([]replica, uint64, error) {
	if err := s.checkKey(key); err != nil {
		return nil, 0, err
	}
	switch {
	case clientID == "":
		return nil, 0, storeErr(storepb.InvalidParams, "empty client id")
	case length == 0:
		return nil, 0, storeErr(storepb.InvalidParams, "zero length")
	case length > s.cfg.MaxValueLen:
		return nil, 0, storeErr(storepb.InvalidParams, "value of %d bytes is over the limit of %d bytes (max_value_size)",
			length, s.cfg.MaxValueLen)
	case cfg.GetReplicaNum() < 0:
		return nil, 0, storeErr(storepb.InvalidParams, "negative replica_num %d", cfg.GetReplicaNum())
	case cfg.GetSoftPinTtlMs() < 0:
		return nil, 0, storeErr(storepb.InvalidParams, "negative soft_pin_ttl_ms %d", cfg.GetSoftPinTtlMs())
	case cfg.GetStripeCount() < 0 || cfg.GetStripeCount() > MaxStripes:
		return nil, 0, storeErr(storepb.InvalidParams, "stripe_count %d is outside [0, %d]", cfg.GetStripeCount(), MaxStripes)
	}
	n := max(int(cfg.GetReplicaNum()), 1)
	admitted, err := s.admitTenant(ctx, key, length*uint64(n))
	if err != nil {
		return nil, 0, err
	}
	defer admitted()
	reps, seq, err := s.tryStart(clientID, key, length, n, cfg, upsert)
	if err != errNoSpace {
		return reps, seq, err
	}
	if s.fitsAnywhere(length, s.stripesFor(length, cfg)) {
		if reps, seq, err = s.startEvicting(ctx, clientID, key, length, n, cfg, upsert); err != errNoSpace {
			return reps, seq, err
		}
		s.needEvict.Store(true)
	}
	s.allocFailures.Add(1)
	if n, left := s.heldFor(length); n > 0 {
		return nil, 0, storeErr(storepb.NoAvailableHandle, "no segment taking new replicas has %d bytes free; %d more held for up to %v after a remount (--remount_hold_sec)",
			length, n, left.Round(time.Millisecond))
	}
	return nil, 0, storeErr(storepb.NoAvailableHandle, "no segment has %d bytes free", length)
}

// started answers a PutStart once its record is durable.
func (s *Service) started(ctx context.Context, reps []replica, seq uint64, err error) ([]*storepb.Replica, error) {
	if err != nil {
		return nil, err
	}
	if err := s.durable(ctx, seq); err != nil {
		return nil, err
	}
	return describeLive(reps), nil
}

func (s *Service) tryStart(clientID, key string, length uint64, n int, cfg *storepb.ReplicateConfig, upsert bool) ([]replica, uint64, error) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	o := sh.objects[key]
	if o != nil {
		if o.complete() && !upsert {
			return nil, 0, storeErr(storepb.ObjectAlreadyExists, "%q", clientKey(key))
		}
		if p := o.pending; p != nil {
			if p.client == clientID && p.size == length && p.upsert == upsert {
				// The client asks again (its first answer was lost in a
				// failover): the same replicas, once their record is durable.
				return live(p.replicas), s.lastSeq(), nil
			}
			if now.Sub(p.started) < s.cfg.PutStartDiscardTimeout {
				return nil, 0, storeErr(storepb.ObjectAlreadyExists, "%q: a put is in flight", clientKey(key))
			}
			// A zombie PutStart: its writer is presumed gone; pre-empt it.
			s.freeAfter(revokeRecord(key), p.replicas)
			o.pending = nil
			s.discarded.Add(1)
		}
	}
	reps := s.allocate(clientID, length, n, cfg)
	if len(reps) == 0 {
		if o != nil && o.empty() {
			delete(sh.objects, key)
		} else if o != nil {
			s.reorderLocked(sh, key, o) // a zombie pre-empted
		}
		return nil, 0, errNoSpace
	}
	if o == nil {
		o = &object{}
		sh.objects[key] = o
	}
	o.pending = &pendingPut{client: clientID, started: now, size: length, replicas: reps, cfg: cfg, upsert: upsert}
	s.reorderLocked(sh, key, o) // no eviction while a put is in flight
	var seq uint64
	if s.j != nil {
		seq = s.record(startRecord(clientID, key, o.pending))
	}
	return live(reps), seq, nil
}

func (r replica) memory() *storepb.MemoryReplica {
	m := &storepb.MemoryReplica{
		SegmentName:       r.seg.name,
		TransportEndpoint: r.seg.endpoint,
		BufferAddress:     r.seg.base + r.off,
		Size:              r.size,
		Medium:            r.seg.medium,
	}
	if r.striped() {
		m.Stripes = make([]*storepb.MemoryReplica, len(r.stripes))
		for i, p := range r.stripes {
			m.Stripes[i] = p.memory()
		}
	}
	return m
}

func (r replica) onDisk() bool { return r.seg.medium == storepb.Medium_MEDIUM_DISK }

// live returns the replicas a client may be sent to: those whose segment is
// not being unmounted. The replicas are copies.
func live(reps []replica) []replica {
	out := make([]replica, 0, len(reps))
	for _, r := range reps {
		if !r.dead() {
			out = append(out, r)
		}
	}
	return out
}

// describe is reps as the protocol sends them, each with status st.
func describe(reps []replica, st storepb.ReplicaStatus) []*storepb.Replica {
	out := make([]*storepb.Replica, 0, len(reps))
	for _, r := range reps {
		out = append(out, &storepb.Replica{
			Status:   st,
			Location: &storepb.Replica_Memory{Memory: r.memory()},
		})
	}
	return out
}

// describeLive is describe(live(reps), PROCESSING) without the copy: the
// replicas of a put in flight that its client may write.
func describeLive(reps []replica) []*storepb.Replica {
	out := make([]*storepb.Replica, 0, len(reps))
	for _, r := range reps {
		if !r.dead() {
			out = append(out, &storepb.Replica{
				Status:   storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING,
				Location: &storepb.Replica_Memory{Memory: r.memory()},
			})
		}
	}
	return out
}

// pendingOf returns key's put in flight, checking that clientID started it.
func (s *Service) pendingOf(sh *shard, clientID, key string) (*object, error) {
	if err := s.checkKey(key); err != nil {
		return nil, err
	}
	o := sh.objects[key]
	if o == nil || o.pending == nil {
		return nil, storeErr(storepb.ObjectNotFound, "%q: no put in flight", clientKey(key))
	}
	if o.pending.client != clientID {
		return nil, storeErr(storepb.InvalidParams, "%q: the put was started by another client", clientKey(key))
	}
	return o, nil
}

// PutEnd makes the replicas of clientID's PutStart (or UpsertStart)
// COMPLETE and the object readable, with its checksum.
func (s *Service) PutEnd(ctx context.Context, clientID, key string, checksum uint32) error {
	seq, err := s.putEndSeq(clientID, key, checksum)
	if err != nil {
		return err
	}
	return s.durable(ctx, seq)
}

// putEndSeq is PutEnd without waiting for its journal record.
func (s *Service) putEndSeq(clientID, key string, checksum uint32) (uint64, error) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o, err := s.pendingOf(sh, clientID, key)
	if err != nil {
		if ended(sh, clientID, key, checksum) {
			// A repeated PutEnd, its first answer lost in a failover.
			return s.lastSeq(), nil
		}
		return 0, err
	}
	return s.endLocked(sh, key, o, clientID, checksum, nil), nil
}

// ended reports whether key holds the value clientID put with checksum,
// its put ended: what a repeated end finds.
func ended(sh *shard, clientID, key string, checksum uint32) bool {
	o := sh.objects[key]
	return o != nil && o.pending == nil && o.complete() && o.writer == clientID && o.checksum == checksum
}

// endLocked makes o's pending put, clientID's, COMPLETE with checksum and
// returns the sequence number of its record: rec, or a JournalEnd when
// rec is nil. sh.mu is held.
func (s *Service) endLocked(sh *shard, key string, o *object, clientID string, checksum uint32, rec *storepb.JournalRecord) uint64 {
	now := s.now()
	p := o.pending
	old := o.replicas
	if len(old) > 0 && (o.size != p.size || o.checksum != checksum) {
		sh.gone.add(key, o.size, o.checksum) // replaced (tier_announce.go)
	}
	if len(old) == 0 {
		sh.gone.known(key, p.size, checksum)
	}
	sh.gone.forget(key, p.size, checksum)
	// A move of the old value (a drain's, a spill, an offload or a
	// promotion) is left without its source: its end must not add the old
	// bytes to the new value, whose replicas may lie where the old ones
	// did once those are freed.
	s.orphanLocked(o)
	o.replicas, o.size, o.checksum, o.pending, o.writer = p.replicas, p.size, checksum, nil, clientID
	o.hardPin = p.cfg.GetWithHardPin()
	o.softPinUntil = time.Time{}
	if p.cfg.GetWithSoftPin() {
		ttl := s.cfg.SoftPinTTL
		if ms := p.cfg.GetSoftPinTtlMs(); ms > 0 {
			ttl = time.Duration(ms) * time.Millisecond
		}
		o.softPinUntil = now.Add(ttl)
	}
	// The replaced value's space is freed once the end is durable; if a
	// reader may be copying it (a lease runs), only when that lease ends.
	leased, until := o.lease.After(now) && len(old) > 0, o.lease
	if !leased {
		o.lease = now
	}
	s.offloadLocked(key, o)
	s.reorderLocked(sh, key, o)
	s.emit(storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT, key)
	s.kvChange(key, s.kvMediaOf(old), s.kvMediaOf(o.replicas), true)
	if s.j == nil {
		// Without a journal nothing waits: no record, no closure.
		s.freeReplaced(old, leased, until)
		return 0
	}
	if rec == nil {
		rec = &storepb.JournalRecord{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{
			ClientId: clientID, Key: key, Checksum: checksum}}}
	}
	return s.j.append(rec, func() { s.freeReplaced(old, leased, until) })
}

// freeReplaced frees old, the replicas a put's end replaced, once that end
// is durable: at once, or, when a reader's lease on them runs (leased),
// when it ends at until.
func (s *Service) freeReplaced(old []replica, leased bool, until time.Time) {
	if !leased {
		s.freeReplicas(old)
		return
	}
	s.segMu.Lock()
	defer s.segMu.Unlock()
	// Replicas on segments unmounted meanwhile have nothing to free;
	// under segMu none can die unseen (removeSegLocked prunes the rest).
	old = slices.DeleteFunc(old, replica.allDead)
	if len(old) > 0 {
		s.deferred = append(s.deferred, deferredFree{at: until, reps: old})
	}
}

// UpsertEnd is PutEnd for an UpsertStart.
func (s *Service) UpsertEnd(ctx context.Context, clientID, key string, checksum uint32) error {
	return s.PutEnd(ctx, clientID, key, checksum)
}

// PutRevoke abandons clientID's PutStart and frees its space. An upsert's
// old value stays readable.
func (s *Service) PutRevoke(ctx context.Context, clientID, key string) error {
	seq, err := s.revokeSeq(clientID, key)
	if err != nil {
		return err
	}
	return s.durable(ctx, seq)
}

// revokeSeq is PutRevoke without waiting for its journal record.
func (s *Service) revokeSeq(clientID, key string) (uint64, error) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o, err := s.pendingOf(sh, clientID, key)
	if err != nil {
		return 0, err
	}
	seq := s.freeAfter(revokeRecord(key), o.pending.replicas)
	o.pending = nil
	if o.empty() {
		delete(sh.objects, key)
	}
	s.reorderLocked(sh, key, o) // an upsert's old value may go again
	return seq, nil
}

// UpsertRevoke is PutRevoke for an UpsertStart.
func (s *Service) UpsertRevoke(ctx context.Context, clientID, key string) error {
	return s.PutRevoke(ctx, clientID, key)
}

// GetReplicaList returns the COMPLETE replicas of key with its checksum and
// length, and grants (or extends) a lease of leaseTTL on it.
func (s *Service) GetReplicaList(key string) (reps []*storepb.Replica, leaseTTL time.Duration, checksum uint32, length uint64, err error) {
	if err := s.checkKey(key); err != nil {
		return nil, 0, 0, 0, err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o, readable, err := readableLocked(sh, key)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	s.grantLease(o)
	s.promoteLocked(key, o)
	s.reorderLocked(sh, key, o)
	return describe(readable, storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE), s.cfg.LeaseTTL, o.checksum, o.size, nil
}

// readableLocked returns key's readable object and its replicas a reader may
// be sent to (copies), on any tier; OBJECT_NOT_FOUND when key has no
// readable value (a first put still in flight has none) or every segment
// holding it is being unmounted. The caller holds sh's lock, key's shard.
func readableLocked(sh *shard, key string) (*object, []replica, error) {
	o := sh.objects[key]
	if o == nil || !o.complete() {
		return nil, nil, storeErr(storepb.ObjectNotFound, "%q", clientKey(key))
	}
	reps := live(o.replicas)
	if len(reps) == 0 { // every segment is being unmounted
		return nil, nil, storeErr(storepb.ObjectNotFound, "%q", clientKey(key))
	}
	return o, reps, nil
}

func (s *Service) grantLease(o *object) {
	if l := s.now().Add(s.cfg.LeaseTTL); l.After(o.lease) {
		o.lease = l
	}
}

// ExistKey reports whether key is readable; like Mooncake, it also grants a
// lease on it. The error is only for an invalid key.
func (s *Service) ExistKey(key string) (bool, error) {
	if err := s.checkKey(key); err != nil {
		return false, err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	if o == nil || !o.complete() {
		return false, nil
	}
	s.grantLease(o)
	s.reorderLocked(sh, key, o)
	return true, nil
}

// Remove deletes key's readable value and frees its replicas. A leased
// object gives ObjectHasLease unless force. A put in flight on the key is
// left alone.
func (s *Service) Remove(ctx context.Context, key string, force bool) error {
	seq, err := s.removeSeq(key, force)
	if err != nil {
		return err
	}
	return s.durable(ctx, seq)
}

// removeSeq is Remove without waiting for its journal record.
func (s *Service) removeSeq(key string, force bool) (uint64, error) {
	if err := s.checkKey(key); err != nil {
		return 0, err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	if o == nil || !o.complete() {
		return 0, storeErr(storepb.ObjectNotFound, "%q", clientKey(key))
	}
	if !force && o.lease.After(s.now()) {
		return 0, storeErr(storepb.ObjectHasLease, "%q", clientKey(key))
	}
	s.dropLocked(sh, key, o, storepb.ObjectEventKind_OBJECT_EVENT_KIND_REMOVED)
	return s.lastSeq(), nil
}

// dropLocked frees o's complete replicas and forgets it unless a put is in
// flight; watches see the key go as kind. sh.mu is held.
func (s *Service) dropLocked(sh *shard, key string, o *object, kind storepb.ObjectEventKind) uint64 {
	var n uint64
	for _, r := range o.replicas {
		n += r.size
	}
	media := s.kvMediaOf(o.replicas)
	if len(o.replicas) > 0 { // tier_announce.go
		if kind == storepb.ObjectEventKind_OBJECT_EVENT_KIND_REMOVED {
			sh.gone.add(key, o.size, o.checksum)
		} else {
			sh.gone.forgot(key, o.size, o.checksum)
		}
	}
	var rec *storepb.JournalRecord // none without a journal
	if s.j != nil {
		rec = dropRecord(key)
	}
	s.freeAfter(rec, o.replicas)
	o.replicas = nil
	s.orphanLocked(o)
	if o.empty() {
		delete(sh.objects, key)
	}
	s.reorderLocked(sh, key, o)
	s.emit(kind, key)
	s.kvChange(key, media, 0, false)
	return n
}

// RemoveAll removes every readable object, skipping leased ones unless
// force, and returns how many it removed.
func (s *Service) RemoveAll(ctx context.Context, force bool) int {
	n, _ := s.removeAll(ctx, force)
	return n
}

// removeAll is RemoveAll with the journal's error: the removals happened
// here, but a new leader may not know of them.
func (s *Service) removeAll(ctx context.Context, force bool) (int, error) {
	return s.removeMatching(ctx, func(string) bool { return true }, force)
}

// MaxRegexLen bounds a RemoveByRegex pattern.
const MaxRegexLen = 4096

// RemoveByRegex removes the readable objects whose key the RE2 pattern
// expr matches anywhere (an unanchored search: "^prefix" for a prefix),
// skipping leased ones unless force, and returns how many it removed. An
// empty pattern, which would match every key, is refused: that is
// RemoveAll.
//
// The keys matched are the default tenant's; RemoveTenantByRegex matches
// another tenant's.
func (s *Service) RemoveByRegex(ctx context.Context, expr string, force bool) (int, error) {
	return s.RemoveTenantByRegex(ctx, DefaultTenant, expr, force)
}

// compileRemoveRegex compiles a RemoveByRegex pattern, refusing an empty
// one and one over MaxRegexLen.
func compileRemoveRegex(expr string) (*regexp.Regexp, error) {
	switch {
	case expr == "":
		return nil, storeErr(storepb.InvalidParams, "empty pattern (RemoveAll removes every object)")
	case len(expr) > MaxRegexLen:
		return nil, storeErr(storepb.InvalidParams, "pattern of %d bytes is longer than %d", len(expr), MaxRegexLen)
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, storeErr(storepb.InvalidParams, "pattern: %v", err)
	}
	return re, nil
}

// removeMatching removes the readable objects whose key match accepts
// (leased ones only with force) and waits for their journal records.
func (s *Service) removeMatching(ctx context.Context, match func(key string) bool, force bool) (int, error) {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for key, o := range sh.objects {
			if !o.complete() || (!force && o.lease.After(now)) || !match(key) {
				continue
			}
			s.dropLocked(sh, key, o, storepb.ObjectEventKind_OBJECT_EVENT_KIND_REMOVED)
			n++
		}
		sh.mu.Unlock()
	}
	return n, s.durable(ctx, s.lastSeq())
}

// ReclaimPuts frees the space of puts in flight for longer than
// PutStartReleaseTimeout, whose writers are presumed dead, and returns how
// many.
func (s *Service) ReclaimPuts() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for key, o := range sh.objects {
			if p := o.pending; p != nil && now.Sub(p.started) >= s.cfg.PutStartReleaseTimeout {
				s.freeAfter(revokeRecord(key), p.replicas)
				o.pending = nil
				if o.empty() {
					delete(sh.objects, key)
				}
				s.reorderLocked(sh, key, o)
				n++
				s.released.Add(1)
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// lastSeq is the journal's last sequence number (0 without a journal).
func (s *Service) lastSeq() uint64 {
	if s.j == nil {
		return 0
	}
	return s.j.last()
}

package master

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/mooncake-go/mooncake/store/storepb"
	"google.golang.org/protobuf/proto"
)

// Puts into space reserved ahead. A client that puts batch after batch
// reserves slots for its next batch while it writes the current one
// (PutReserve): each slot is an ordinary PutStart under a name the master
// makes up, journaled and durable before the answer, so it is placed,
// counted against eviction and the tenant's quota, reclaimed when
// abandoned and kept across a failover as any put in flight. Once the
// values are written, BatchPutCommit gives each slot's space to its key
// and ends the put: one round trip and one journal wait per batch instead
// of two. In the journal a commit is one record (JournalCommit: the slot's
// revoke, the key's start with the slot's replicas and its end), so a put
// into a slot costs the journal two records, as any put.

// slotPrefix starts the names of slots (as the client sees them; the
// Service stores them scoped by tenant like any key). A NUL byte starts no
// key a client would pick.
const slotPrefix = "\x00slot/"

// slotNames makes up the names of slots: a random stem per Service, so
// that a new leader never reuses the name of a slot its predecessor
// reserved, and a counter.
type slotNames struct {
	stem string
	n    atomic.Uint64
}

func (sn *slotNames) next() uint64 { return sn.n.Add(1) }

// slotKey returns the name of slot stem+n as the client sees it, and as
// tenant t's key, built together (a batch reserves hundreds).
func slotKey(t, stem string, n uint64) (name, key string) {
	var b strings.Builder
	b.Grow(2 + len(stem) + 20)
	b.WriteString("\x00\x00") // scopeKey's escape of a default tenant's key
	b.WriteString(stem)
	var d [20]byte
	b.Write(strconv.AppendUint(d[:0], n, 10))
	k := b.String()
	if t == DefaultTenant || t == "" {
		return k[2:], k
	}
	return k[2:], scopeKey(t, k[2:])
}

func newSlotNames() *slotNames {
	return &slotNames{stem: slotPrefix + strconv.FormatUint(rand.Uint64(), 36) + "/"}
}

// isSlot reports whether a client's key names a slot.
func isSlot(key string) bool { return strings.HasPrefix(key, slotPrefix) }

// PutReserve starts count puts of length bytes for clientID, under slot
// names in tenant t's key space, and waits once for their records. It
// reserves as many as fit and a batch put may start, at least one, else
// answers as PutStart would.
func (s *Service) PutReserve(ctx context.Context, t, clientID string, length uint64, count int, cfg *storepb.ReplicateConfig) ([]*storepb.PutSlot, error) {
	slots, err := s.reserve(ctx, t, clientID, "", length, count, cfg, false)
	return describeSlots(slots), err
}

// reservedSlot is a slot as a reserve answers it: its name, which is stem
// followed by the decimal digits of n, and its live replicas (copies).
type reservedSlot struct {
	name, stem string
	n          uint64
	reps       []replica
}

// describeSlots is slots as PutSlot messages.
func describeSlots(slots []reservedSlot) []*storepb.PutSlot {
	if len(slots) == 0 {
		return nil
	}
	out := make([]*storepb.PutSlot, len(slots))
	for i, sl := range slots {
		out[i] = &storepb.PutSlot{Slot: sl.name, Replicas: describeLive(sl.reps)}
	}
	return out
}

// packSlots is slots of length bytes as PackedSlots, or false when they do
// not pack: of several stems (none a reserve answers), or with replicas
// striped, of another length, of different counts per slot or on a
// segment that went since (describeSlots leaves those out).
func packSlots(slots []reservedSlot, length uint64) (*storepb.PackedSlots, bool) {
	if len(slots) == 0 {
		return nil, false
	}
	r := len(slots[0].reps)
	p := &storepb.PackedSlots{
		Stem:     slots[0].stem,
		Index:    make([]uint64, len(slots)),
		Replicas: uint32(r),
		Segment:  make([]uint32, 0, len(slots)*r),
		Address:  make([]uint64, 0, len(slots)*r),
	}
	segs := map[*segment]uint32{} // index in p.Segments
	for i, sl := range slots {
		if sl.stem != p.Stem || len(sl.reps) != r || r == 0 {
			return nil, false
		}
		p.Index[i] = sl.n
		for _, rep := range sl.reps {
			if rep.striped() || rep.size != length || rep.dead() {
				return nil, false
			}
			k, ok := segs[rep.seg]
			if !ok {
				k = uint32(len(p.Segments))
				segs[rep.seg] = k
				p.Segments = append(p.Segments, &storepb.MemoryReplica{SegmentName: rep.seg.name,
					TransportEndpoint: rep.seg.endpoint, Medium: rep.seg.medium})
			}
			p.Segment = append(p.Segment, k)
			p.Address = append(p.Address, rep.seg.base+rep.off)
		}
	}
	return p, true
}

// reserve is PutReserve with the slots named after clientID and nonce,
// when nonce is set, and bounded to 1/boundedShare of the DRAM pool when
// bounded is (PutReserveRequest.bounded): a reserve whose answer was lost, asked again with the
// same nonce (a retry, maybe to the next leader, which has the slots from
// the journal), answers the slots it made, still in flight, instead of
// making more that nobody would use until the master reclaims them. A
// retry that overtook the first call (its connection dropped while the
// handler ran on) waits for it, so as to answer every slot it made.
func (s *Service) reserve(ctx context.Context, t, clientID, nonce string, length uint64, count int, cfg *storepb.ReplicateConfig, bounded bool) ([]reservedSlot, error) {
	switch {
	case len(nonce) > maxNonce:
		return nil, storeErr(storepb.InvalidParams, "reserve nonce of %d bytes (max %d)", len(nonce), maxNonce)
	case count <= 0:
		return nil, storeErr(storepb.InvalidParams, "reserve of %d slots", count)
	}
	if _, _, ok := s.cfg.Tenants.quota(t); ok {
		// Slots would take from the tenant's quota space no put asked for.
		return nil, storeErr(storepb.InvalidParams, "tenant %q has a quota: no slots", t)
	}
	// No more than a batch put may start.
	if length == 0 || length > s.cfg.MaxBatchValueBytes {
		return nil, storeErr(storepb.InvalidParams, "reserve of slots of %d bytes (max_batch_value_size %d)", length, s.cfg.MaxBatchValueBytes)
	}
	count = min(count, s.cfg.MaxBatch, int(min(s.cfg.MaxBatchValueBytes/length, uint64(s.cfg.MaxBatch))))
	// A slot is one allocation, which the client fills with values end
	// to end: never striped. Values that are (asked, or over the master's
	// StripeMinSize) get no slots; their puts go the usual way.
	if s.stripesFor(length, cfg) > 1 {
		return nil, storeErr(storepb.InvalidParams, "values of %d bytes are striped: no slots", length)
	}
	one := &storepb.ReplicateConfig{}
	if cfg != nil {
		one = proto.CloneOf(cfg)
	}
	one.StripeCount = 1
	cfg = one
	stem, num := s.slots.stem, func(int) uint64 { return s.slots.next() }
	if nonce != "" {
		stem = slotPrefix + "n/" + clientID + "/" + nonce + "/"
		num = func(i int) uint64 { return uint64(i) }
		id := t + "\x00" + stem
		done := make(chan struct{})
		if prev, busy := s.reserving.LoadOrStore(id, done); busy {
			select {
			case <-prev.(chan struct{}):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			defer func() {
				s.reserving.Delete(id)
				close(done)
			}()
		}
		// A reserve makes its slots in the order of their names and
		// stops at the first it cannot make: when the first is not in
		// flight, an earlier call made none, or its slots went since
		// (the client commits or revokes only slots it was answered,
		// and so none of a lost answer's), but for those that outlived
		// the first (its segment went), which the loop below answers
		// as it finds them. The first call of a nonce, the usual case,
		// looks up one name.
		if _, key := slotKey(t, stem, 0); s.inFlight(clientID, key, length) != nil {
			if made := s.reserved(t, clientID, stem, length, 0, count); len(made) > 0 {
				// Durable before they were first answered: the first
				// reserve waited, or failed before it could answer.
				return made, s.durable(ctx, s.lastSeq())
			}
		}
	}
	if bounded {
		// After the nonce's lookup: a retry answers every slot its first
		// call made, whatever the pool holds now.
		fit, err := s.boundedSlots(length, cfg)
		if err != nil {
			return nil, err
		}
		count = int(min(uint64(count), fit))
	}
	var (
		out  []reservedSlot
		last uint64
	)
	for i := range count {
		n := num(i)
		slot, key := slotKey(t, stem, n)
		reps, seq, err := s.startSeq(ctx, clientID, key, length, cfg, false)
		if err != nil {
			if nonce != "" {
				// Slots of an earlier call past this name, still in
				// flight, are the client's: answered, not left to the
				// reclaim.
				out = append(out, s.reserved(t, clientID, stem, length, i+1, count)...)
				last = s.lastSeq()
			}
			if len(out) == 0 {
				return nil, err
			}
			break
		}
		if out == nil {
			out = make([]reservedSlot, 0, count)
		}
		out = append(out, reservedSlot{name: slot, stem: stem, n: n, reps: reps})
		last = max(last, seq)
	}
	if err := s.durable(ctx, last); err != nil {
		return nil, err
	}
	return out, nil
}

// boundedSlots is how many slots of length bytes (cfg's replicas each)
// 1/boundedShare of the DRAM pool holds: an error when none, refused
// (InvalidParams) where the pool is too small, NoAvailableHandle before any
// segment is mounted.
func (s *Service) boundedSlots(length uint64, cfg *storepb.ReplicateConfig) (uint64, error) {
	s.segMu.Lock()
	capacity, _ := s.usageLocked(storepb.Medium_MEDIUM_DRAM)
	s.segMu.Unlock()
	if capacity == 0 {
		return 0, storeErr(storepb.NoAvailableHandle, "no DRAM segment mounted")
	}
	reps := uint64(max(cfg.GetReplicaNum(), 1))
	// Divided, never multiplied: length and replicas are the caller's.
	if fit := capacity / boundedShare / length / reps; fit > 0 {
		return fit, nil
	}
	return 0, storeErr(storepb.InvalidParams, "slots of %d bytes x %d replicas: 1/%d of the DRAM pool (%d bytes) holds none",
		length, reps, boundedShare, capacity)
}

// maxNonce bounds the nonce of a reserve, which is part of its slots' names.
const maxNonce = 64

// boundedShare: a bounded reserve takes at most 1/boundedShare of the DRAM
// pool's capacity.
const boundedShare = 64

// reserved returns the slots stem+from, ..., stem+(count-1) of length
// bytes that clientID has in flight: those an earlier reserve under the
// same names made, as it answered them.
func (s *Service) reserved(t, clientID, stem string, length uint64, from, count int) []reservedSlot {
	var out []reservedSlot
	for i := from; i < count; i++ {
		slot, key := slotKey(t, stem, uint64(i))
		sh := s.shardOf(key)
		sh.mu.Lock()
		if p := s.inFlightLocked(sh, clientID, key, length); p != nil {
			out = append(out, reservedSlot{name: slot, stem: stem, n: uint64(i), reps: live(p.replicas)})
		}
		sh.mu.Unlock()
	}
	return out
}

// inFlight returns clientID's put of length bytes in flight under key.
func (s *Service) inFlight(clientID, key string, length uint64) *pendingPut {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.inFlightLocked(sh, clientID, key, length)
}

func (s *Service) inFlightLocked(sh *shard, clientID, key string, length uint64) *pendingPut {
	if o := sh.objects[key]; o != nil && o.pending != nil && o.pending.client == clientID && o.pending.size == length {
		return o.pending
	}
	return nil
}

// commitSeq puts clientID's value, written into slot, under key with
// checksum, without waiting for its journal records (t is the caller's
// tenant). A key that exists or has a put of another's in flight answers
// ObjectAlreadyExists and leaves the slot to the client, whose value it
// may hold again; a slot gone (reclaimed, or lost with its segment)
// answers ObjectNotFound.
func (s *Service) commitSeq(t, clientID, slot, key string, checksum uint32) (uint64, error) {
	switch {
	case !isSlot(slot):
		return 0, storeErr(storepb.InvalidParams, "%q is not a slot", slot)
	case isSlot(key):
		return 0, storeErr(storepb.InvalidParams, "%q: keys starting %q are the master's", key, slotPrefix)
	}
	sk, key := scopeKey(t, slot), scopeKey(t, key)
	if err := s.checkKey(key); err != nil {
		return 0, err
	}
	ssh, ksh := s.lockShards(sk, key)
	defer unlockShards(ssh, ksh)
	so, err := s.pendingOf(ssh, clientID, sk)
	if err != nil {
		if ended(ksh, clientID, key, checksum) {
			// A repeated commit, its first answer lost in a failover.
			return s.lastSeq(), nil
		}
		return 0, err
	}
	now := s.now()
	o := ksh.objects[key]
	if o != nil {
		if o.complete() {
			return 0, storeErr(storepb.ObjectAlreadyExists, "%q", clientKey(key))
		}
		if p := o.pending; p != nil {
			if now.Sub(p.started) < s.cfg.PutStartDiscardTimeout {
				return 0, storeErr(storepb.ObjectAlreadyExists, "%q: a put is in flight", clientKey(key))
			}
			// A zombie PutStart, as tryStart pre-empts it.
			s.freeAfter(revokeRecord(key), p.replicas)
			o.pending = nil
			s.discarded.Add(1)
		}
	}
	// The slot's space passes to the key, which ends its put there: one
	// record (JournalCommit), whose durability the caller waits for.
	p := so.pending
	so.pending = nil
	gone := so.empty()
	if gone {
		delete(ssh.objects, sk)
	}
	p.started = now
	if o == nil {
		if gone && so.moving == nil && so.ev.class == classNone && !so.ev.pinned {
			// The slot's object, in no map or order now, is the key's.
			*so = object{}
			o = so
		} else {
			o = &object{}
		}
		ksh.objects[key] = o
	}
	o.pending = p
	var rec *storepb.JournalRecord // none without a journal
	if s.j != nil {
		rec = &storepb.JournalRecord{Op: &storepb.JournalRecord_Commit{
			Commit: &storepb.JournalCommit{ClientId: clientID, Slot: sk, Key: key, Checksum: checksum}}}
	}
	return s.endLocked(ksh, key, o, clientID, checksum, rec), nil
}

// lockShards locks the shards of keys a and b (once when they are the
// same) in the order of their index, so that two commits locking the same
// pair never deadlock, and returns them; unlockShards unlocks them.
func (s *Service) lockShards(a, b string) (*shard, *shard) {
	i, j := s.shardIndex(a), s.shardIndex(b)
	sa, sb := &s.shards[i], &s.shards[j]
	switch {
	case i == j:
		sa.mu.Lock()
	case i > j:
		sb.mu.Lock()
		sa.mu.Lock()
	default:
		sa.mu.Lock()
		sb.mu.Lock()
	}
	return sa, sb
}

func unlockShards(sa, sb *shard) {
	sa.mu.Unlock()
	if sb != sa {
		sb.mu.Unlock()
	}
}

// PutReserve serves Service.PutReserve.
func (g *GRPCServer) PutReserve(ctx context.Context, req *storepb.PutReserveRequest) (*storepb.PutReserveResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	slots, err := g.svc.Load().reserve(ctx, t, req.ClientId, req.Nonce, req.ValueLength, int(req.Count), req.Config, req.Bounded)
	resp := &storepb.PutReserveResponse{Result: storepb.NewResult(err)}
	if req.Packed {
		if p, ok := packSlots(slots, req.ValueLength); ok {
			resp.Packed = p
			return resp, nil
		}
	}
	resp.Slots = describeSlots(slots)
	return resp, nil
}

// BatchPutCommit commits each item (Service.commitSeq), then waits once
// for their records.
func (g *GRPCServer) BatchPutCommit(ctx context.Context, req *storepb.BatchPutCommitRequest) (*storepb.BatchResult, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	svc := g.svc.Load()
	if err := svc.checkBatch(len(req.Items)); err != nil {
		return nil, err
	}
	return &storepb.BatchResult{Results: batchDurable(ctx, svc, len(req.Items), func(i int) (uint64, error) {
		it := req.Items[i]
		return svc.commitSeq(t, req.ClientId, it.GetSlot(), it.GetKey(), it.GetChecksum())
	})}, nil
}

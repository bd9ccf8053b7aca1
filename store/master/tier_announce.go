package master

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"

	"github.com/mooncake-go/mooncake/store/alloc"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// An SSD tier outlives its node's process: the file stays, and a node
// restarted on it mounts the tier with the objects the file still holds
// (MountDisk), each checked by the node against the checksum it recorded
// when it wrote the bytes. The master takes an object unless it knows the
// key with another value (an upsert or a new put since), or a put of it is
// in flight, or it removed or replaced that value since (goneValues); what it takes is journaled like a put (or, for a key still
// known, like an offload), so it survives the master too.

// goneValues remembers the values removed or replaced by a newer one, as
// (key, size, checksum): the SSD tier files of nodes still hold the bytes
// of such values where their space was not reused (a node is not told of
// frees), and a node restarted on its file must not bring them back. A
// value merely evicted (or lost with its segment) is the key's last: it
// may come back, which is the point of the tier outliving its node, and
// no other value of the key may, until a new value is put, which makes it
// gone. Each shard keeps those of its keys, under its lock, the oldest
// forgotten first past a bound. Not journaled: a master that restarted
// takes back what its nodes offer, as it did before.
type goneValues struct {
	m     map[goneValue]uint64 // value -> when it was remembered
	order []goneAt             // oldest first
	next  uint64
	// last is the value of keys the shard forgot without a removal
	// (evicted, or lost with their segment): still the key's value, until
	// a new one is put. Nil until the shard first forgets one.
	last *lastValues
}

// lastValues is goneValues.last: the last maxGoneValues values forgotten,
// in a ring, each key once, with a fingerprint of each key to scan. Every
// eviction writes one and every put of a new key looks its key up, each
// in a shard whose memory is cold: a ring costs a write and a scan of
// 512 bytes of fingerprints, where a map of keys and a queue of its order
// cost several cache misses.
type lastValues struct {
	fp   [maxGoneValues]uint32 // of v[i].key; 0: empty
	v    [maxGoneValues]goneValue
	next int // the slot to write next: the oldest
}

// lastSeed seeds the fingerprints of lastValues.
var lastSeed = maphash.MakeSeed()

// fingerprint is key's in lastValues: never 0.
func fingerprint(key string) uint32 { return uint32(maphash.String(lastSeed, key)) | 1 }

// find returns the slot of key, -1 when it has none.
func (l *lastValues) find(key string, fp uint32) int {
	for i, f := range &l.fp {
		if f == fp && l.v[i].key == key {
			return i
		}
	}
	return -1
}

// put makes v key's value, in place of the oldest past the bound.
func (l *lastValues) put(v goneValue) {
	fp := fingerprint(v.key)
	if i := l.find(v.key, fp); i >= 0 {
		l.fp[i], l.v[i] = 0, goneValue{}
	}
	l.fp[l.next], l.v[l.next] = fp, v
	l.next = (l.next + 1) % maxGoneValues
}

// get returns key's value, if it has one.
func (l *lastValues) get(key string) (goneValue, int, bool) {
	if l == nil {
		return goneValue{}, -1, false
	}
	i := l.find(key, fingerprint(key))
	if i < 0 {
		return goneValue{}, -1, false
	}
	return l.v[i], i, true
}

type goneValue struct {
	key  string
	size uint64
	sum  uint32
}

type goneAt struct {
	v  goneValue
	at uint64
}

// maxGoneValues bounds the values a shard remembers (128k in all with
// the default 1024 shards).
const maxGoneValues = 128

// add remembers key's value of size bytes and checksum sum as gone.
func (g *goneValues) add(key string, size uint64, sum uint32) {
	if g.m == nil {
		g.m = map[goneValue]uint64{}
	}
	v := goneValue{key, size, sum}
	g.next++
	g.m[v] = g.next
	g.order = append(g.order, goneAt{v, g.next})
	for len(g.order) > maxGoneValues {
		if old := g.order[0]; g.m[old.v] == old.at { // not remembered again since
			delete(g.m, old.v)
		}
		g.order = g.order[1:]
	}
}

// forget drops key's value from the gone ones: it is the key's again.
func (g *goneValues) forget(key string, size uint64, sum uint32) {
	if len(g.m) > 0 {
		delete(g.m, goneValue{key, size, sum})
	}
}

// has reports whether key's value of size bytes and checksum sum is gone:
// removed, replaced, or not the last value the key had.
func (g *goneValues) has(key string, size uint64, sum uint32) bool {
	if l, _, ok := g.last.get(key); ok && l != (goneValue{key, size, sum}) {
		return true
	}
	_, ok := g.m[goneValue{key, size, sum}]
	return ok
}

// forgot remembers key's value, which the shard forgot without a removal.
func (g *goneValues) forgot(key string, size uint64, sum uint32) {
	if g.last == nil {
		g.last = &lastValues{}
	}
	g.last.put(goneValue{key, size, sum})
}

// known says key has a value again (put anew, or taken from a tier):
// the one it had when forgotten is gone unless it is the same.
func (g *goneValues) known(key string, size uint64, sum uint32) {
	l, i, ok := g.last.get(key)
	if !ok {
		return
	}
	g.last.fp[i], g.last.v[i] = 0, goneValue{}
	if l != (goneValue{key, size, sum}) {
		g.add(l.key, l.size, l.sum)
	}
}

// MountDisk mounts seg, clientID's SSD tier, with objs, the objects its
// file holds, and reports which objects it took. A repeated MountDisk
// (same segment, same client) mounts nothing again and reports the objects
// that have a replica at their place on seg. With again (the client was
// told to remount), a tier this master does not know takes no new copies
// for RemountHold, as ReMountSegment's segments.
func (s *Service) MountDisk(ctx context.Context, clientID string, seg *storepb.Segment, objs []*storepb.DiskObject, again bool) ([]bool, error) {
	if clientID == "" {
		return nil, storeErr(storepb.InvalidParams, "empty client id")
	}
	if err := checkSegment(seg); err != nil {
		return nil, err
	}
	if seg.Medium != storepb.Medium_MEDIUM_DISK {
		return nil, storeErr(storepb.InvalidParams, "segment %s: MountDisk mounts SSD tiers (medium DISK) only", seg.Id)
	}
	taken := make([]bool, len(objs))
	s.segMu.Lock()
	if old, ok := s.segs[seg.Id]; ok {
		s.segMu.Unlock()
		if old.client != clientID {
			return nil, storeErr(storepb.InvalidParams, "segment %s is mounted by another client", seg.Id)
		}
		s.segMu.Lock()
		s.touchLocked(clientID)
		s.segMu.Unlock()
		for i, d := range objs {
			taken[i] = s.hasReplicaAt(d.GetKey(), old, d.GetOffset())
		}
		return taken, nil
	}
	// The objects' spans are allocated in the new segment from the start,
	// so no move can be given their bytes; those not taken are freed below.
	cand := s.diskCandidates(seg.Size, objs)
	spans := make([]alloc.Span, 0, len(cand))
	for _, i := range cand {
		spans = append(spans, alloc.Span{Off: objs[i].Offset, Size: objs[i].Size})
	}
	a, err := alloc.Restore(seg.Size, spans)
	if err != nil {
		s.segMu.Unlock()
		return nil, storeErr(storepb.InvalidParams, "segment %s: %v", seg.Id, err)
	}
	sg := newSegment(clientID, seg, a, len(s.segList))
	sg.heldUntil = s.remountHoldEnd(again)
	s.logHold(sg)
	s.segs[sg.id] = sg
	s.segList = append(s.segList, sg)
	s.diskTiers.Add(1)
	c := s.touchLocked(clientID)
	c.segs[sg.id] = sg
	if sg.hostID != "" {
		c.hostID = sg.hostID
	}
	last := s.record(mountRecord(clientID, seg, sg.heldUntil))
	s.segMu.Unlock()

	for _, i := range cand {
		d := objs[i]
		seq, ok := s.adoptDisk(clientID, d, replica{seg: sg, off: d.Offset, size: d.Size})
		taken[i] = ok
		last = max(last, seq)
		if !ok {
			s.freeReplicas([]replica{{seg: sg, off: d.Offset, size: d.Size}})
		}
	}
	return taken, s.durable(ctx, last)
}

// diskCandidates returns the indexes of objs worth offering to the pool:
// a valid key and a non-empty span inside the segment, the first of any
// overlapping spans and of any repeated key.
func (s *Service) diskCandidates(size uint64, objs []*storepb.DiskObject) []int {
	var idx []int
	seen := make(map[string]bool, len(objs))
	for i, d := range objs {
		if d == nil || d.Size == 0 || d.Offset%alloc.DefaultAlignment != 0 || d.Offset+d.Size < d.Offset ||
			d.Offset+d.Size > size || s.checkKey(d.Key) != nil || seen[d.Key] {
			continue
		}
		seen[d.Key] = true
		idx = append(idx, i)
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(objs[a].Offset, objs[b].Offset) })
	out := idx[:0]
	end := uint64(0)
	for _, i := range idx {
		if objs[i].Offset < end {
			continue // overlaps the one before
		}
		out = append(out, i)
		// Sizes take whole granules, as the allocator rounds them.
		end = objs[i].Offset + (objs[i].Size+alloc.DefaultAlignment-1)&^(alloc.DefaultAlignment-1)
	}
	return out
}

// adoptDisk makes r, on a newly mounted SSD tier, a replica of d's key:
// a new object when the key is unknown, an SSD copy more when the key
// holds the same value (size and checksum). It returns the journal record
// and whether it took r.
func (s *Service) adoptDisk(clientID string, d *storepb.DiskObject, r replica) (uint64, bool) {
	sh := s.shardOf(d.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[d.Key]
	switch {
	case o == nil && sh.gone.has(d.Key, d.Size, d.Checksum):
		return 0, false // removed, or replaced, since the node wrote it
	case o == nil:
		sh.gone.known(d.Key, d.Size, d.Checksum)
		o = &object{size: d.Size, checksum: d.Checksum, replicas: []replica{r}, writer: clientID, lease: s.now()}
		sh.objects[d.Key] = o
		start := startRecord(clientID, d.Key, &pendingPut{size: d.Size, replicas: o.replicas, cfg: &storepb.ReplicateConfig{}})
		s.record(start)
		s.emit(storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT, d.Key)
		s.kvChange(d.Key, 0, s.kvMediaOf(o.replicas), true)
		return s.record(&storepb.JournalRecord{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{
			ClientId: clientID, Key: d.Key, Checksum: d.Checksum}}}), true
	case o.pending != nil || !o.complete() || o.size != d.Size || o.checksum != d.Checksum:
		// A put in flight, or another value: the bytes on disk are stale.
		return 0, false
	}
	media := s.kvMediaOf(o.replicas)
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{
		Key: d.Key, From: locations(o.replicas[:1])[0], To: locations([]replica{r})[0], KeepFrom: true}}}
	o.replicas = append(o.replicas, r)
	dramFirst(o.replicas)
	s.kvChange(d.Key, media, s.kvMediaOf(o.replicas), false)
	return s.record(rec), true
}

// hasReplicaAt reports whether key has a replica on sg at off.
func (s *Service) hasReplicaAt(key string, sg *segment, off uint64) bool {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.objects[key]
	return o != nil && slices.ContainsFunc(o.replicas, func(r replica) bool { return r.seg == sg && r.off == off })
}

// TierServer serves the storepb.Tier gRPC service over the service a
// GRPCServer serves (a standby answers Unavailable, as for Master).
type TierServer struct {
	storepb.UnimplementedTierServer
	g *GRPCServer
}

var _ storepb.TierServer = (*TierServer)(nil)

// MountDisk is Service.MountDisk.
func (t *TierServer) MountDisk(ctx context.Context, req *storepb.MountDiskRequest) (*storepb.MountDiskResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	taken, err := t.g.svc.Load().MountDisk(ctx, req.ClientId, req.Segment, req.Objects, req.Again)
	return &storepb.MountDiskResponse{Result: storepb.NewResult(err), Taken: taken}, nil
}

package client

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Put sessions: what Mooncake's batch_put_session_start/_end/_revoke and
// batch_put_from_multi_buffer_ranges need. A session is a put taken apart:
// StartPutSession is the put's PutStart (the master reserves replicas of
// the given sizes), BatchPutRanges writes pieces of the values into those
// replicas as they become available (one KV-cache layer at a time, say)
// with no master round trip, and EndPutSession is the PutEnd that makes
// the objects readable (RevokePutSession the PutRevoke that gives the
// space back).
//
// The checksum the master keeps is computed from the pieces: each piece
// written contributes its CRC-32C term (crc32c.Shift), and when the
// pieces written cover the value exactly once their terms add up to the
// checksum of the whole. Otherwise (a gap, an overlap, a failed write)
// the value is sealed without a checksum, as one put with NoChecksum.

// PutRange is one piece of a ranged put: Src written at offset Dst of the
// value.
type PutRange struct {
	Dst uint64
	Src []byte
}

// putSession is one key's open put session.
type putSession struct {
	size uint64
	reps []*storepb.Replica
	// writes counts the BatchPutRanges in progress on the session; End and
	// Revoke take the session out of the map first, so none starts after
	// they wait.
	writes sync.WaitGroup
	mu     sync.Mutex
	pieces map[uint64]piece // by offset: what was written there
}

// piece is a range written into a session's replicas, and its CRC-32C.
type piece struct {
	n   uint64
	crc uint32
}

// putSessions are the client's open put sessions, by key.
type putSessions struct {
	mu sync.Mutex
	m  map[string]*putSession
}

// add keeps s as the session of key, unless key has one.
func (ps *putSessions) add(key string, s *putSession) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = make(map[string]*putSession)
	}
	if _, ok := ps.m[key]; ok {
		return false
	}
	ps.m[key] = s
	return true
}

// has reports whether key has a session.
func (ps *putSessions) has(key string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[key] != nil
}

// join returns key's session with a write registered on it, or nil.
func (ps *putSessions) join(key string) *putSession {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	s := ps.m[key]
	if s != nil {
		s.writes.Add(1)
	}
	return s
}

// take removes key's session and returns it once its writes in progress
// are done, or nil when key has none.
func (ps *putSessions) take(key string) *putSession {
	ps.mu.Lock()
	s := ps.m[key]
	delete(ps.m, key)
	ps.mu.Unlock()
	if s != nil {
		s.writes.Wait()
	}
	return s
}

// keys lists the keys with an open session.
func (ps *putSessions) keys() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]string, 0, len(ps.m))
	for k := range ps.m {
		out = append(out, k)
	}
	return out
}

// noSession is the error of a key without an open put session (Mooncake
// answers INVALID_PARAMS).
func noSession(key string) error {
	return &storepb.Error{Code: storepb.InvalidParams, Msg: "no put session for " + quote(key)}
}

// StartPutSession reserves space for objects of the given sizes without
// writing them: the master's PutStart, one round trip for the batch. The
// objects are not readable until EndPutSession. It returns an error per
// key: InvalidParams for an empty key, a zero size or a key whose session
// is open, ObjectAlreadyExists for a key that exists (or appears twice),
// NoAvailableHandle when the pool is full. rc nil means Config.Replicate.
func (c *Client) StartPutSession(ctx context.Context, keys []string, sizes []uint64, rc *ReplicateConfig) []error {
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	if len(sizes) != len(keys) {
		return fill(len(keys), &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and sizes differ in number"})
	}
	if rc == nil {
		rc = &c.cfg.Replicate
	}
	if err := rc.validate(); err != nil {
		return fill(len(keys), &storepb.Error{Code: storepb.InvalidParams, Err: err})
	}
	errs := make([]error, len(keys))
	items := make([]*putItem, len(keys))
	var live []*putItem
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		switch {
		case k == "":
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty key"}
		case sizes[i] == 0:
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "zero size for " + quote(k)}
		case c.puts.has(k):
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "put session already open for " + quote(k)}
		case seen[k]:
			// The master would refuse the second start of the batch.
			errs[i] = &storepb.Error{Code: storepb.ObjectAlreadyExists, Msg: quote(k) + " twice in one session start"}
		default:
			seen[k] = true
			items[i] = &putItem{key: k, n: sizes[i]}
			live = append(live, items[i])
		}
	}
	if len(live) > 0 {
		c.start(ctx, live, rc.proto(), false)
	}
	var lost []string
	for i, it := range items {
		if it == nil {
			continue
		}
		if errs[i] = it.err; it.started && !c.puts.add(it.key, &putSession{size: it.n, reps: it.reps}) {
			// A concurrent start of the same key won the map.
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "put session already open for " + quote(it.key)}
			lost = append(lost, it.key)
		}
	}
	if len(lost) > 0 {
		_ = c.revoke(ctx, lost)
	}
	return errs
}

// BatchPutRanges writes pieces of the values of open put sessions: for
// keys[i], each of ranges[i] into the value at its offset Dst, in every
// replica (from registered memory directly, other memory through the
// staging buffer). It returns the bytes written per key (the sum of its
// ranges' lengths). A key without a session, or a range past the size
// given at the start, fails with InvalidParams and nothing of it is
// written. Ranges may be written in any order and more than once; the
// last write of a byte wins.
func (c *Client) BatchPutRanges(ctx context.Context, keys []string, ranges [][]PutRange) ([]int, []error) {
	ns := make([]int, len(keys))
	if err := c.enter(); err != nil {
		return ns, fill(len(keys), err)
	}
	defer c.leave()
	if len(ranges) != len(keys) {
		return ns, fill(len(keys), &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and range lists differ in number"})
	}
	errs := make([]error, len(keys))
	items := make([]*putItem, len(keys))
	sessions := make([]*putSession, len(keys))
	wrote := make([]bool, len(keys)) // the key's ranges went to its replicas
	var live []*putItem
	for i, k := range keys {
		s := c.puts.join(k)
		if s == nil {
			errs[i] = noSession(k)
			continue
		}
		sessions[i] = s
		it := &putItem{key: k, reps: s.reps, parts: make([][]byte, len(ranges[i])), offs: make([]uint64, len(ranges[i]))}
		for j, r := range ranges[i] {
			if r.Dst > s.size || uint64(len(r.Src)) > s.size-r.Dst {
				it.err = &storepb.Error{Code: storepb.InvalidParams,
					Msg: fmt.Sprintf("%s: range %d (%d bytes at %d) past the value's %d bytes", quote(k), j, len(r.Src), r.Dst, s.size)}
				break
			}
			it.parts[j], it.offs[j] = r.Src, r.Dst
		}
		if it.err == nil {
			it.err = c.locate(it)
		}
		items[i] = it
		if it.err == nil {
			live, wrote[i] = append(live, it), true
		}
	}
	if len(live) > 0 {
		c.write(ctx, live)
	}
	for i, s := range sessions {
		if s == nil {
			continue
		}
		it := items[i]
		if errs[i] = it.err; it.err == nil {
			ns[i] = int(partsSize(it.parts))
		}
		if wrote[i] {
			c.record(s, it)
		}
		s.writes.Done()
	}
	return ns, errs
}

// record notes what a ranged write did to its session's value, for the
// checksum: the pieces it wrote, or, when it failed, that the bytes at
// its offsets are unknown.
func (c *Client) record(s *putSession, it *putItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pieces == nil {
		s.pieces = make(map[uint64]piece)
	}
	for j, p := range it.parts {
		if len(p) == 0 {
			continue
		}
		off := it.offs[j]
		if it.err != nil || it.unsummed || c.cfg.NoChecksum {
			// Either the replicas may hold anything there, or nobody
			// wants the checksum: either way a gap makes the value
			// sealed without one.
			delete(s.pieces, off)
			continue
		}
		s.pieces[off] = piece{n: uint64(len(p)), crc: it.partSum(j)}
	}
}

// checksum is the CRC-32C of the session's value as the master keeps it,
// when the pieces written tile the value exactly; else 0 (none).
func (s *putSession) checksum() uint32 {
	offs := make([]uint64, 0, len(s.pieces))
	for off := range s.pieces {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	var sum uint32
	next := uint64(0)
	for _, off := range offs {
		p := s.pieces[off]
		if off != next {
			return 0
		}
		next = off + p.n
		sum ^= crc32c.Shift(p.crc, s.size-next)
	}
	if next != s.size {
		return 0
	}
	return nonZero(sum)
}

// EndPutSession makes the objects of keys readable (the master's PutEnd)
// once the ranged writes in progress on them are done, and closes their
// sessions. Bytes never written read as whatever the replicas held. A key
// without a session fails with InvalidParams; a key whose end the master
// refuses keeps its session, to end again or revoke.
func (c *Client) EndPutSession(ctx context.Context, keys []string) []error {
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	errs := make([]error, len(keys))
	items := make([]*putItem, 0, len(keys))
	taken := make(map[*putItem]*putSession, len(keys))
	at := make(map[*putItem]int, len(keys))
	for i, k := range keys {
		s := c.puts.take(k)
		if s == nil {
			errs[i] = noSession(k)
			continue
		}
		it := &putItem{key: k, reps: s.reps, started: true}
		if !c.cfg.NoChecksum {
			it.sum = s.checksum()
		}
		items = append(items, it)
		taken[it], at[it] = s, i
	}
	if len(items) > 0 {
		c.end(ctx, items)
	}
	for _, it := range items {
		if errs[at[it]] = it.err; it.err != nil {
			c.puts.add(it.key, taken[it])
		}
	}
	return errs
}

// RevokePutSession gives back the space reserved for the objects of keys
// (the master's PutRevoke) once the ranged writes in progress on them are
// done, and closes their sessions: the objects never become readable. A
// key without a session fails with InvalidParams; the session is closed
// whatever the master answers (a start it still holds is reclaimed by
// the master later).
func (c *Client) RevokePutSession(ctx context.Context, keys []string) []error {
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	errs := make([]error, len(keys))
	var open []string
	var at []int
	for i, k := range keys {
		if c.puts.take(k) == nil {
			errs[i] = noSession(k)
			continue
		}
		open, at = append(open, k), append(at, i)
	}
	if len(open) > 0 {
		for j, err := range c.revoke(ctx, open) {
			errs[at[j]] = err
		}
	}
	return errs
}

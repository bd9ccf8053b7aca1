package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func quote(k string) string { return strconv.Quote(k) }

// getItem is one object of a get.
type getItem struct {
	key    string
	dst    []byte   // where the value goes
	parts  [][]byte // or where its pieces go, in order (parts.go)
	ranges []Range  // or which pieces of the value to read, and where (ranges.go)
	alloc  bool     // the caller gave no buffer: allocate dst
	length uint64
	sum    uint32                   // the master's checksum of the value; 0: none
	got    uint32                   // CRC-32C of what this attempt read, term by term
	reps   []*storepb.MemoryReplica // nearest first; tried in turn
	start  time.Time
	ttlMs  int64
	err    error // final, or the last attempt's while tries remain
	done   bool  // read and verified
	final  bool  // err stands: no further replica is tried
	cached bool  // reps came from the lease cache
}

// Get returns the value of key, read from its nearest complete replica
// (this process, then this host, then others), verified against its
// checksum. It fails with ObjectNotFound when key is not readable.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	vals, errs := c.BatchGet(ctx, []string{key})
	return vals[0], errs[0]
}

// GetInto reads the value of key into dst and returns its length. dst must
// hold the whole value (InvalidParams otherwise); registered memory
// (RegisterBuffer) is read into directly, other memory through the staging
// buffer.
func (c *Client) GetInto(ctx context.Context, key string, dst []byte) (int, error) {
	ns, errs := c.BatchGetInto(ctx, []string{key}, [][]byte{dst})
	return ns[0], errs[0]
}

// BatchGet is Get of many keys, with one master round trip and one engine
// batch per attempt.
func (c *Client) BatchGet(ctx context.Context, keys []string) ([][]byte, []error) {
	items := make([]*getItem, len(keys))
	for i, k := range keys {
		items[i] = &getItem{key: k, alloc: true}
	}
	c.getMany(ctx, items)
	vals, errs := make([][]byte, len(keys)), make([]error, len(keys))
	for i, it := range items {
		if errs[i] = it.err; it.err == nil {
			vals[i] = it.dst[:it.length]
		}
	}
	return vals, errs
}

// BatchGetInto is GetInto of many keys; it returns each value's length.
func (c *Client) BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, []error) {
	ns, errs := make([]int, len(keys)), make([]error, len(keys))
	if len(dsts) != len(keys) {
		for i := range errs {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and buffers differ in number"}
		}
		return ns, errs
	}
	items := make([]*getItem, len(keys))
	for i, k := range keys {
		items[i] = &getItem{key: k, dst: dsts[i]}
	}
	c.getMany(ctx, items)
	for i, it := range items {
		if errs[i] = it.err; it.err == nil {
			ns[i] = int(it.length)
		}
	}
	return ns, errs
}

// lookup finds the replicas of every item, ordered nearest first: from
// the lease cache where it has a usable entry, else from the master.
func (c *Client) lookup(ctx context.Context, items []*getItem) {
	start := time.Now()
	if c.leases != nil {
		var ask []*getItem
		for _, it := range items {
			if e := c.leases.get(it.key, start); e != nil {
				it.length, it.sum, it.start, it.ttlMs, it.reps, it.cached = e.length, e.sum, e.start, e.ttlMs, e.reps, true
				continue
			}
			ask = append(ask, it)
		}
		items = ask
	}
	if len(items) == 0 {
		return
	}
	req := &storepb.BatchKeyRequest{ClientId: c.id, Keys: make([]string, len(items))}
	for i, it := range items {
		req.Keys[i] = it.key
	}
	var resp *storepb.BatchGetReplicaListResponse
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchGetReplicaList(ctx, req)
		return err
	})
	err = batchErr(err, len(resp.GetItems()), len(items))
	for i, it := range items {
		if err != nil {
			it.err = err
			continue
		}
		r := resp.Items[i]
		if it.err = r.Result.AsError(); it.err != nil {
			continue
		}
		it.length, it.sum, it.start, it.ttlMs = r.ValueLength, r.Checksum, start, r.LeaseTtlMs
		for _, rep := range r.Replicas {
			if m := rep.GetMemory(); m != nil && rep.Status == storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE && replicaLen(m) >= it.length {
				it.reps = append(it.reps, m)
			}
		}
		slices.SortStableFunc(it.reps, func(a, b *storepb.MemoryReplica) int { return cmp.Compare(c.distance(a), c.distance(b)) })
		if len(it.reps) == 0 {
			it.err = &storepb.Error{Code: storepb.ObjectNotFound, Msg: quote(it.key) + ": no readable replica"}
		} else if c.leases != nil {
			c.leases.put(it.key, &cached{length: it.length, sum: it.sum, reps: it.reps, start: start, ttlMs: it.ttlMs})
		}
	}
}

// distance ranks replicas: DRAM before SSD, then this process, this host,
// elsewhere. A striped replica is as near as its farthest piece.
func (c *Client) distance(m *storepb.MemoryReplica) int {
	d := 0
	if m.Medium == storepb.Medium_MEDIUM_DISK {
		d = 3
	}
	switch {
	case inProcess(m, c.name):
		return d
	case c.onHost(m):
		return d + 1
	}
	return d + 2
}

// verifies reports whether reads of it are checked against its checksum.
func (c *Client) verifies(it *getItem) bool { return it.sum != 0 && !c.cfg.NoChecksum }

func (c *Client) getMany(ctx context.Context, items []*getItem) {
	if err := c.enter(); err != nil {
		for _, it := range items {
			it.err = err
		}
		return
	}
	defer c.leave()
	start := time.Now()
	defer func() {
		var n uint64
		for _, it := range items {
			if it.err == nil {
				n += it.length
			}
		}
		c.met.readBytes.Add(float64(n))
		c.met.observe("get", len(items), start, func(i int) error { return items[i].err })
	}()
	var live []*getItem
	for _, it := range items {
		if it.key == "" {
			it.err = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty key"}
			continue
		}
		live = append(live, it)
	}
	if len(live) == 0 {
		return
	}
	c.lookup(ctx, live)
	c.readAll(ctx, live)
	// A read from a cached list that failed gets one fresh lookup: the
	// object may have been force-removed or its node lost.
	var again []*getItem
	for _, it := range live {
		if it.cached && !it.done {
			c.leases.drop(it.key)
			*it = getItem{key: it.key, dst: it.dst, parts: it.parts, ranges: it.ranges, alloc: it.alloc}
			again = append(again, it)
		}
	}
	if len(again) > 0 {
		c.lookup(ctx, again)
		c.readAll(ctx, again)
	}
}

// readAll reads every looked-up item from its nearest replica that works.
func (c *Client) readAll(ctx context.Context, live []*getItem) {
	for _, it := range live {
		switch {
		case it.err != nil:
			it.final = true
		case it.ranges != nil:
			if it.err = it.checkRanges(); it.err != nil {
				it.final = true
			}
		case it.alloc && uint64(len(it.dst)) < it.length:
			it.dst = make([]byte, it.length)
		case it.room() < it.length:
			it.err = &storepb.Error{Code: storepb.InvalidParams,
				Msg: fmt.Sprintf("%s: buffer of %d bytes for a value of %d", quote(it.key), it.room(), it.length)}
			it.final = true
		}
	}
	// Attempt k reads each unfinished item from its k-th nearest replica.
	for k := 0; ; k++ {
		var round []*getItem
		for _, it := range live {
			if !it.done && !it.final && k < len(it.reps) {
				round = append(round, it)
			}
		}
		if len(round) == 0 {
			return
		}
		// Items on their last replica may use all their lease; the others
		// only a share of it (attemptDeadline). A round shares one engine
		// deadline, so the two kinds go in two rounds, side by side: one
		// key's spare replicas must not cut another's last read short.
		last := slices.DeleteFunc(slices.Clone(round), func(it *getItem) bool { return len(it.reps)-k > 1 })
		if len(last) == 0 || len(last) == len(round) {
			c.readRound(ctx, round, k)
			continue
		}
		more := slices.DeleteFunc(round, func(it *getItem) bool { return len(it.reps)-k <= 1 })
		var wg sync.WaitGroup
		wg.Go(func() { c.readRound(ctx, more, k) })
		c.readRound(ctx, last, k)
		wg.Wait()
	}
}

// attemptDeadline is when the reads of round from their k-th replicas
// must be done. Reads must finish within the leases (past one, the space
// may hold another object), and a replica that does not answer (its node
// cut off, not dead) must leave time for the next: each attempt gets an
// equal share of what is left of the lease, so the last replica is tried
// within the lease too. A round shares one deadline, the earliest of its
// items' (readAll keeps items on their last replica in a round of their
// own). Zero: no lease, no deadline.
func attemptDeadline(round []*getItem, k int, now time.Time) time.Time {
	var deadline time.Time
	for _, it := range round {
		if it.ttlMs <= 0 {
			continue
		}
		end := it.start.Add(time.Duration(it.ttlMs) * time.Millisecond)
		if left := len(it.reps) - k; left > 1 && end.After(now) {
			end = now.Add(end.Sub(now) / time.Duration(left))
		}
		if deadline.IsZero() || end.Before(deadline) {
			deadline = end
		}
	}
	return deadline
}

// readRound reads every item of round from its k-th replica. An item
// whose read fails or whose bytes fail the checksum stays undone with its
// error, for the next replica to try; one past its lease fails for good.
func (c *Client) readRound(ctx context.Context, round []*getItem, k int) {
	type piece struct {
		it     *getItem
		x      *xfer
		staged []byte // copy into into afterwards
		into   []byte
		at     place // where into is
		off    int
	}
	var (
		xs     []*xfer
		pieces []piece
	)
	deadline := attemptDeadline(round, k, time.Now())
	// The lease bounds the engine's requests (no timer per read here).
	flush := func() {
		c.run(ctx, xs, deadline)
		for _, p := range pieces {
			if p.staged != nil {
				if p.x.err == nil {
					p.x.err = p.at.copyTo(p.into, p.staged)
				}
				c.stage.release(p.staged)
			}
			if p.x.err != nil {
				p.it.err = p.x.err
			} else if p.x.crc {
				end := uint64(p.off + len(p.x.local))
				p.it.got ^= crc32c.Shift(p.x.sum, p.it.length-end)
			}
		}
		xs, pieces = xs[:0], pieces[:0]
	}
	// readPiece adds the read of len(dst) bytes at remote in piece m of
	// a replica, at off in the value: straight into dst where the engine
	// can reach it (or a plain copy reach it, from a piece in this
	// process into host memory), else through the staging buffer, which
	// the driver copies out of into GPU memory.
	readPiece := func(it *getItem, m *storepb.MemoryReplica, dst []byte, remote uint64, off int, verify bool) {
		at, err := c.placeOf(dst)
		if err != nil {
			it.err = err
			return
		}
		if (m.SegmentName == c.name && !at.onGPU()) || c.registered(dst) {
			x := &xfer{op: engine.Read, local: dst, seg: m.SegmentName, remote: remote, crc: verify}
			xs, pieces = append(xs, x), append(pieces, piece{it: it, x: x, off: off})
			return
		}
		for o := uint64(0); o < uint64(len(dst)); {
			n := min(uint64(len(dst))-o, c.stage.max())
			buf, ok := c.stage.tryAcquire(n)
			if !ok {
				flush()
				var err error
				if buf, err = c.stage.acquire(ctx, n); err != nil {
					it.err = &storepb.Error{Code: storepb.TransferFail, Err: err}
					return
				}
			}
			x := &xfer{op: engine.Read, local: buf, seg: m.SegmentName, remote: remote + o, crc: verify}
			xs, pieces = append(xs, x), append(pieces, piece{it: it, x: x, staged: buf, into: dst[o:], at: at, off: off + int(o)})
			o += n
		}
	}
	// read adds the read of bytes [off, off+len(dst)) of the value from
	// replica m into dst: one read per piece of m they overlap.
	read := func(it *getItem, m *storepb.MemoryReplica, dst []byte, off uint64, verify bool) {
		spans(m, off, uint64(len(dst)), func(p *storepb.MemoryReplica, remote, at, n uint64) {
			readPiece(it, p, dst[at-off:at-off+n], remote, int(at), verify)
		})
	}
	for _, it := range round {
		it.err, it.got = nil, 0
		m := it.reps[k]
		verify := c.verifies(it)
		if it.ranges != nil {
			// A piece of a value cannot be checked against the checksum
			// of the whole.
			for _, r := range it.ranges {
				if len(r.Dst) > 0 {
					read(it, m, r.Dst, r.Src, false)
				}
			}
			continue
		}
		if it.parts != nil {
			for _, p := range it.partReads(m, verify) {
				xs, pieces = append(xs, p.x), append(pieces, piece{it: it, x: p.x, off: int(p.off)})
			}
			continue
		}
		read(it, m, it.dst[:it.length], 0, verify)
	}
	flush()
	now := time.Now()
	for _, it := range round {
		switch {
		case it.ttlMs > 0 && now.After(it.start.Add(time.Duration(it.ttlMs)*time.Millisecond)):
			it.err = &storepb.Error{Code: storepb.LeaseExpired, Msg: quote(it.key) + ": the read outlived its lease"}
			it.final = true
		case it.err != nil:
		case it.ranges == nil && c.verifies(it) && nonZero(it.got) != it.sum:
			it.err = &storepb.Error{Code: storepb.ChecksumMismatch,
				Msg: fmt.Sprintf("%s: %s", quote(it.key), replicaWhere(it.reps[k]))}
		default:
			it.done = true
		}
	}
}

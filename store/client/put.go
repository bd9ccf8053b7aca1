package client

import (
	"context"
	"errors"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// checksum is the CRC-32C of a value as the master keeps it (nonZero).
func checksum(b []byte) uint32 { return nonZero(crc32c.Checksum(b)) }

// nonZero maps a CRC-32C of 0 to 1: 0 means "none" on the wire.
func nonZero(sum uint32) uint32 { return max(sum, 1) }

// putItem is one object of a put: its value and what became of it.
type putItem struct {
	key   string
	value []byte
	parts [][]byte // the value in pieces, when value is nil (parts.go)
	offs  []uint64 // where each part goes in the value (nil: one after another)
	n     uint64   // the value's length when neither holds it (a put session)
	from  bool     // value must be in registered memory (PutFrom)
	sum   uint32
	// places says where the value (places[0]) or each part lives. With
	// late, some of it (on a GPU, or large: summedLater) has its checksum
	// taken by the transfers that write it: sums holds the CRC-32C of each
	// part (of the value, whole), unsummed that a piece went to no replica.
	places   []place
	late     bool
	sums     []uint32
	unsummed bool
	reps     []*storepb.Replica
	err      error
	// started: the master holds a PutStart for it that needs an end or a
	// revoke.
	started bool
	// upsert: it was started as an upsert.
	upsert bool
	// slot: it is written into this slot reserved ahead (put_slots.go),
	// reserved at slotAt, and committed instead of ended.
	slot   string
	slotAt time.Time
}

// Put stores value under key, write-once: when the key exists Put
// succeeds without overwriting it, as Mooncake's put does (use Upsert to
// replace). A value in memory registered with RegisterBuffer is written
// from where it is; any other passes through the staging buffer. rc nil
// means Config.Replicate.
func (c *Client) Put(ctx context.Context, key string, value []byte, rc *ReplicateConfig) error {
	return c.BatchPut(ctx, []string{key}, [][]byte{value}, rc)[0]
}

// PutFrom is Put of a value in registered memory (RegisterBuffer), which
// is never staged; unregistered memory gives InvalidParams.
func (c *Client) PutFrom(ctx context.Context, key string, value []byte, rc *ReplicateConfig) error {
	return c.BatchPutFrom(ctx, []string{key}, [][]byte{value}, rc)[0]
}

// BatchPutFrom is PutFrom of many objects: a value outside registered
// memory fails alone (InvalidParams), the rest are put as by BatchPut.
func (c *Client) BatchPutFrom(ctx context.Context, keys []string, values [][]byte, rc *ReplicateConfig) []error {
	var argErr error
	if len(values) != len(keys) {
		argErr = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and values differ in number"}
	}
	return c.putItems(ctx, keys, argErr, func(i int) *putItem { return &putItem{value: values[i], from: true} }, rc, false)
}

// Upsert stores value under key, replacing an existing value once the new
// one is written; readers see the old value or the new, never a mix.
func (c *Client) Upsert(ctx context.Context, key string, value []byte, rc *ReplicateConfig) error {
	return c.BatchUpsert(ctx, []string{key}, [][]byte{value}, rc)[0]
}

// BatchPut is Put of many objects with one round trip to the master for
// each phase and one engine batch per wave of staging memory. It returns
// one error per key.
func (c *Client) BatchPut(ctx context.Context, keys []string, values [][]byte, rc *ReplicateConfig) []error {
	return c.putMany(ctx, keys, values, rc, false)
}

// BatchUpsert is Upsert of many objects.
func (c *Client) BatchUpsert(ctx context.Context, keys []string, values [][]byte, rc *ReplicateConfig) []error {
	return c.putMany(ctx, keys, values, rc, true)
}

func (c *Client) putMany(ctx context.Context, keys []string, values [][]byte, rc *ReplicateConfig, upsert bool) []error {
	var argErr error
	if len(values) != len(keys) {
		argErr = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and values differ in number"}
	}
	return c.putItems(ctx, keys, argErr, func(i int) *putItem { return &putItem{value: values[i]} }, rc, upsert)
}

// putItems is the frame of every batch put: item(i) gives the value of
// keys[i] (whole or in parts); the items that pass the checks are started,
// written and ended together. argErr, when set, fails every key (the
// arguments do not match). It returns one error per key.
func (c *Client) putItems(ctx context.Context, keys []string, argErr error, item func(i int) *putItem, rc *ReplicateConfig, upsert bool) (errs []error) {
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	start := time.Now()
	defer func() { c.met.observe("put", len(keys), start, func(i int) error { return errs[i] }) }()
	if argErr != nil {
		return fill(len(keys), argErr)
	}
	if rc == nil {
		rc = &c.cfg.Replicate
	}
	if err := rc.validate(); err != nil {
		return fill(len(keys), &storepb.Error{Code: storepb.InvalidParams, Err: err})
	}
	items := make([]*putItem, len(keys))
	var live []*putItem
	for i, k := range keys {
		it := item(i)
		it.key = k
		items[i] = it
		switch {
		case k == "":
			it.err = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty key"}
		case it.size() == 0:
			it.err = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty value for " + quote(k)}
		default:
			if it.err = c.checkRegistered(it); it.err != nil {
				continue
			}
			if it.err = c.locate(it); it.err != nil {
				continue
			}
			if !c.cfg.NoChecksum && !it.late {
				it.sum = it.checksum()
			}
			live = append(live, it)
		}
	}
	if len(live) > 0 {
		if upsert && c.leases != nil {
			for _, it := range live {
				c.leases.drop(it.key)
			}
		}
		slots := c.slotsFor(rc, upsert)
		// A second round puts the items whose slot the master no longer
		// had the usual way.
		for todo, round := live, 0; len(todo) > 0 && round < 2; round++ {
			rest := todo
			if slots && round == 0 {
				rest = c.takeSlots(ctx, todo)
			}
			if len(rest) > 0 {
				c.start(ctx, rest, rc.proto(), upsert)
			}
			if slots && round == 0 {
				// The next batch's slots are reserved while this one is
				// written: after its own space was granted, which a
				// reserve running beside it could otherwise take.
				c.refill(rc.proto(), todo)
			}
			c.write(ctx, todo)
			for _, it := range todo {
				if it.late && it.err == nil {
					it.sum = it.lateChecksum()
				}
			}
			todo = c.end(ctx, todo)
		}
	}
	errs = make([]error, len(keys))
	for i, it := range items {
		errs[i] = it.err
	}
	return errs
}

// checkRegistered refuses an item whose memory must be registered and is
// not: parts always, a whole value for PutFrom.
func (c *Client) checkRegistered(it *putItem) error {
	switch {
	case it.parts != nil:
		return c.checkParts("put", it.key, it.parts)
	case it.from && !c.registered(it.value):
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "PutFrom: buffer is not registered"}
	}
	return nil
}

// start asks the master where to write every item.
func (c *Client) start(ctx context.Context, items []*putItem, rc *storepb.ReplicateConfig, upsert bool) {
	req := &storepb.BatchPutStartRequest{Items: make([]*storepb.PutStartRequest, len(items))}
	for i, it := range items {
		req.Items[i] = &storepb.PutStartRequest{ClientId: c.id, Key: it.key, ValueLength: it.size(), Config: rc}
	}
	var resp *storepb.BatchPutStartResponse
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		if upsert {
			resp, err = rpc.BatchUpsertStart(ctx, req)
		} else {
			resp, err = rpc.BatchPutStart(ctx, req)
		}
		return err
	})
	err = batchErr(err, len(resp.GetItems()), len(items))
	for i, it := range items {
		if err != nil {
			it.err = err
			continue
		}
		r := resp.Items[i]
		it.upsert = upsert
		if it.err = r.Result.AsError(); it.err == nil {
			it.reps, it.started = r.Replicas, true
		}
	}
}

// write copies every started item into its replicas, staging values that
// are not in registered memory. Staging runs in waves when the batch does
// not fit the buffer at once; a value bigger than a quarter of the buffer
// is staged piece by piece. Memory on a GPU is staged by the driver's
// copies, and reaches a replica in this process through the engine too.
func (c *Client) write(ctx context.Context, items []*putItem) {
	// owner is what an xfer writes for: its item and, for the one xfer
	// that checksums a piece of GPU memory, the part's sum to fold the
	// piece's into, after bytes of the part following it.
	type owner struct {
		it    *putItem
		sum   *uint32
		after uint64
	}
	var (
		xs     []*xfer
		owners []owner
		staged [][]byte
	)
	flush := func() {
		merged, at := coalesce(xs, c.registered)
		c.run(ctx, merged, time.Time{})
		for i, x := range xs {
			if m := merged[at[i]]; m != x {
				x.err = m.err
			}
			o := owners[i]
			switch {
			case x.err != nil && o.it.err == nil:
				o.it.err = x.err
			case x.err == nil && o.sum != nil:
				*o.sum ^= crc32c.Shift(x.sum, o.after)
			}
		}
		for _, b := range staged {
			c.stage.release(b)
		}
		xs, owners, staged = xs[:0], owners[:0], staged[:0]
	}
	// add writes src at off in the item's value to its replicas in this
	// process (here) and elsewhere (there); a striped replica is here
	// only when all its pieces are, and each piece it overlaps takes its
	// own write. With sum, the writes to the first replica checksum src
	// for it, each its own stretch, folded by the bytes of the part
	// after it.
	add := func(it *putItem, src []byte, off int, here, there bool, sum *uint32, after uint64) {
		for _, r := range it.reps {
			m := r.GetMemory()
			if m == nil {
				continue
			}
			if local := inProcess(m, c.name); (local && !here) || (!local && !there) {
				continue
			}
			end := uint64(off + len(src))
			spans(m, uint64(off), uint64(len(src)), func(p *storepb.MemoryReplica, remote, at, n uint64) {
				x := &xfer{op: engine.Write, local: src[at-uint64(off) : at-uint64(off)+n], seg: p.SegmentName, remote: remote, crc: sum != nil}
				xs, owners = append(xs, x), append(owners, owner{it: it, sum: sum, after: after + end - (at + n)})
			})
			c.met.writeBytes.Add(float64(len(src)))
			sum = nil
		}
		if sum != nil {
			it.unsummed = true
		}
	}
	// piece writes part j of the item, src, at off in its value. From
	// host memory, replicas in this process take a plain copy from the
	// caller's memory and only the others need it registered, else it
	// goes through the staging buffer. From GPU memory every replica is
	// written by the engine, from registered memory or from the staging
	// buffer the driver copies it into.
	piece := func(it *putItem, j int, src []byte, off int) {
		p := it.places[j]
		var sum *uint32
		if it.late && summedLater(p, len(src)) {
			// Folded from zero: a second round writes the piece again.
			it.sums[j] = 0
			sum = &it.sums[j]
		}
		if !p.onGPU() {
			add(it, src, off, true, false, nil, 0)
			if !c.needsEngine(it.reps) {
				if sum != nil {
					// Only plain copies here: the caller's pass it is.
					*sum = crc32c.Checksum(src)
				}
				return
			}
		}
		if c.registered(src) {
			add(it, src, off, p.onGPU(), true, sum, 0)
			return
		}
		for o := 0; o < len(src); {
			n := min(uint64(len(src)-o), c.stage.max())
			buf, ok := c.stage.tryAcquire(n)
			if !ok {
				flush()
				var err error
				if buf, err = c.stage.acquire(ctx, n); err != nil {
					it.err = &storepb.Error{Code: storepb.TransferFail, Err: err}
					return
				}
			}
			if err := p.copyTo(buf, src[o:]); err != nil {
				c.stage.release(buf)
				it.err = err
				return
			}
			staged = append(staged, buf)
			add(it, buf, off+o, p.onGPU(), true, sum, uint64(len(src)-o)-n)
			o += int(n)
		}
	}
	for _, it := range items {
		if it.err != nil {
			continue
		}
		it.unsummed = false
		if it.parts == nil {
			piece(it, 0, it.value, 0)
			continue
		}
		// Parts are written from where they are, each at its offset in
		// the value.
		off := 0
		for j, p := range it.parts {
			if it.offs != nil {
				off = int(it.offs[j])
			}
			if len(p) > 0 && it.err == nil {
				piece(it, j, p, off)
			}
			off += len(p)
		}
	}
	flush()
}

// coalesce makes each run of consecutive writes of xs that continue one
// another, in one array here and in one segment there, one write: a batch
// of small values put from one buffer into space allocated in a row
// crosses the engine as a few large requests instead of one per value.
// Writes that checksum what they move stay apart, and so do two whose
// memory together is not one registration (registered: a value registered
// on its own next to another). It returns the writes to run and, for each
// of xs, the index of the one it went into (xs[i] itself when it stands
// alone).
func coalesce(xs []*xfer, registered func([]byte) bool) (out []*xfer, at []int) {
	at = make([]int, len(xs))
	for i, x := range xs {
		if n := len(out); n > 0 && continues(out[n-1], x) &&
			registered(out[n-1].local[:len(out[n-1].local)+len(x.local)]) {
			last := out[n-1]
			if last == xs[i-1] {
				// The run's first write stays as it is: merge into a copy.
				cp := *last
				last, out[n-1] = &cp, &cp
			}
			last.local = last.local[:len(last.local)+len(x.local)]
			at[i] = n - 1
			continue
		}
		out = append(out, x)
		at[i] = len(out) - 1
	}
	return out, at
}

// continues reports whether write b goes on where write a ends, here and
// there.
func continues(a, b *xfer) bool {
	n := len(a.local)
	return a.op == engine.Write && b.op == engine.Write && !a.crc && !b.crc && n > 0 && len(b.local) > 0 &&
		a.seg == b.seg && a.remote+uint64(n) == b.remote &&
		cap(a.local) >= n+len(b.local) && &a.local[:n+1][n] == &b.local[0]
}

// needsEngine reports whether some replica, or some piece of one, lives
// outside this process.
func (c *Client) needsEngine(reps []*storepb.Replica) bool {
	for _, r := range reps {
		if m := r.GetMemory(); m != nil && !inProcess(m, c.name) {
			return true
		}
	}
	return false
}

// end makes written items readable and gives the space of failed ones
// back. A put whose PutEnd the master no longer knows (it failed over
// between start and end, before the start was durable) fails with the
// master's error; the caller may put again. Items written into slots are
// committed; it returns those whose slot was gone, to be put again.
func (c *Client) end(ctx context.Context, items []*putItem) (again []*putItem) {
	var done, failed, slotted []*putItem
	for _, it := range items {
		switch {
		case !it.started:
		case it.err == nil && it.slot != "":
			slotted = append(slotted, it)
		case it.err == nil:
			done = append(done, it)
		default:
			failed = append(failed, it)
		}
	}
	if len(slotted) > 0 {
		again = c.commit(ctx, slotted)
	}
	if len(done) > 0 {
		req := &storepb.BatchPutEndRequest{Items: make([]*storepb.PutEndRequest, len(done))}
		for i, it := range done {
			req.Items[i] = &storepb.PutEndRequest{ClientId: c.id, Key: it.key, Checksum: it.sum}
		}
		var resp *storepb.BatchResult
		err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
			resp, err = rpc.BatchPutEnd(ctx, req)
			return err
		})
		err = batchErr(err, len(resp.GetResults()), len(done))
		for i, it := range done {
			if it.err = err; err == nil {
				it.err = resp.Results[i].AsError()
			}
		}
	}
	if len(failed) > 0 {
		keys := make([]string, len(failed))
		slotLost := false
		for i, it := range failed {
			if keys[i] = it.key; it.slot != "" {
				keys[i], slotLost = it.slot, true
			}
		}
		if slotLost {
			// The others may sit on the segment this one failed on.
			keys = append(keys, c.dropSlots()...)
		}
		// Best effort: an unrevoked start is reclaimed by the master later.
		_ = c.revoke(ctx, keys)
	}
	if c.cfg.ReportExisting {
		// The caller wants to hear of a key that exists.
		return again
	}
	for _, it := range items {
		// Write-once: the key exists already, which Mooncake's put reports
		// as success. Not an upsert's: it meets ObjectAlreadyExists only
		// when another write of the key is in flight, and wrote nothing.
		if !it.upsert && errors.Is(it.err, storepb.ErrObjectAlreadyExists) && !it.started {
			it.err = nil
		}
	}
	return again
}

// revoke gives back the space the master reserved for the started puts of
// keys; the master's answer per key.
func (c *Client) revoke(ctx context.Context, keys []string) []error {
	req := &storepb.BatchKeyRequest{ClientId: c.id, Keys: keys}
	var resp *storepb.BatchResult
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchPutRevoke(ctx, req)
		return err
	})
	err = batchErr(err, len(resp.GetResults()), len(keys))
	errs := make([]error, len(keys))
	for i := range keys {
		if errs[i] = err; err == nil {
			errs[i] = resp.Results[i].AsError()
		}
	}
	return errs
}

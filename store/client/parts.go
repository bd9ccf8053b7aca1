package client

import (
	"context"
	"fmt"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Values made of parts: one object whose bytes lie in several buffers (one
// per layer of a KV cache, say), written from and read into those buffers
// directly. The object is the concatenation of its parts in order; every
// part is one engine request per replica, and the checksum is that of the
// concatenation, so a value put from parts reads back whole with Get and a
// value put whole reads into parts with BatchGetIntoParts.

// partsSize is the total length of parts.
func partsSize(parts [][]byte) uint64 {
	var n uint64
	for _, p := range parts {
		n += uint64(len(p))
	}
	return n
}

// size is the length of the item's value.
func (it *putItem) size() uint64 {
	if it.parts != nil {
		return partsSize(it.parts)
	}
	return uint64(len(it.value))
}

// checkParts reports the first non-empty part of key's that is not in
// registered memory.
func (c *Client) checkParts(op, key string, parts [][]byte) error {
	for j, p := range parts {
		if len(p) > 0 && !c.registered(p) {
			return &storepb.Error{Code: storepb.InvalidParams,
				Msg: fmt.Sprintf("%s %s: part %d (%d bytes) is not in registered memory", op, quote(key), j, len(p))}
		}
	}
	return nil
}

// BatchPutFromParts is BatchPut of values made of parts: the value of
// keys[i] is the concatenation of parts[i], each part in memory registered
// with RegisterBuffer (InvalidParams otherwise), written to the replicas
// from where it is, with no copy into one buffer. Empty parts are allowed
// as long as the whole value is not empty. Like Put it is write-once. It
// returns one error per key.
func (c *Client) BatchPutFromParts(ctx context.Context, keys []string, parts [][][]byte, rc *ReplicateConfig) (errs []error) {
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	start := time.Now()
	defer func() { c.met.observe("put", len(keys), start, func(i int) error { return errs[i] }) }()
	errs = make([]error, len(keys))
	fail := func(code storepb.Code, msg string) []error {
		for i := range errs {
			errs[i] = &storepb.Error{Code: code, Msg: msg}
		}
		return errs
	}
	if len(parts) != len(keys) {
		return fail(storepb.InvalidParams, "keys and part lists differ in number")
	}
	if rc == nil {
		rc = &c.cfg.Replicate
	}
	if err := rc.validate(); err != nil {
		return fail(storepb.InvalidParams, err.Error())
	}
	items := make([]*putItem, len(keys))
	var live []*putItem
	for i, k := range keys {
		// A nil list still marks the item as one of parts.
		ps := parts[i]
		if ps == nil {
			ps = [][]byte{}
		}
		it := &putItem{key: k, parts: ps}
		items[i] = it
		switch {
		case k == "":
			it.err = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty key"}
		case it.size() == 0:
			it.err = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty value for " + quote(k)}
		default:
			if it.err = c.checkParts("put", k, ps); it.err != nil {
				continue
			}
			if !c.cfg.NoChecksum {
				var sum uint32
				for _, p := range ps {
					sum = crc32c.Update(sum, p)
				}
				it.sum = nonZero(sum)
			}
			live = append(live, it)
		}
	}
	if len(live) > 0 {
		c.start(ctx, live, rc.proto(), false)
		c.writeParts(ctx, live)
		c.end(ctx, live)
	}
	for i, it := range items {
		errs[i] = it.err
	}
	return errs
}

// writeParts copies every started item's parts into its replicas: one
// engine batch, a request per non-empty part and replica (plain copies for
// replicas in this process). The parts are registered, so nothing is
// staged.
func (c *Client) writeParts(ctx context.Context, items []*putItem) {
	var (
		xs    []*xfer
		owner []*putItem
	)
	for _, it := range items {
		if it.err != nil {
			continue
		}
		for _, r := range it.reps {
			m := r.GetMemory()
			if m == nil {
				continue
			}
			off := uint64(0)
			for _, p := range it.parts {
				if len(p) == 0 {
					continue
				}
				xs = append(xs, &xfer{op: engine.Write, local: p, seg: m.SegmentName, remote: m.BufferAddress + off})
				owner = append(owner, it)
				c.met.writeBytes.Add(float64(len(p)))
				off += uint64(len(p))
			}
		}
	}
	c.run(ctx, xs, time.Time{})
	for i, x := range xs {
		if x.err != nil && owner[i].err == nil {
			owner[i].err = x.err
		}
	}
}

// BatchGetIntoParts is BatchGetInto of values read into parts: the value
// of keys[i] fills parts[i] in order (the first len(parts[i][0]) bytes
// into the first part, and so on), read by the engine into each part
// directly and verified against the checksum of the whole value. Every
// part must be in registered memory (InvalidParams otherwise). A value
// longer than its parts together fails with InvalidParams and nothing is
// read; a shorter one fills a prefix of them. It returns each value's
// length.
func (c *Client) BatchGetIntoParts(ctx context.Context, keys []string, parts [][][]byte) ([]int, []error) {
	ns, errs := make([]int, len(keys)), make([]error, len(keys))
	if len(parts) != len(keys) {
		for i := range errs {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and part lists differ in number"}
		}
		return ns, errs
	}
	items := make([]*getItem, len(keys))
	var live []*getItem
	for i, k := range keys {
		ps := parts[i]
		if ps == nil {
			ps = [][]byte{}
		}
		items[i] = &getItem{key: k, parts: ps}
		if k != "" {
			if errs[i] = c.checkParts("get", k, ps); errs[i] != nil {
				continue
			}
		}
		live = append(live, items[i])
	}
	if len(live) > 0 {
		c.getMany(ctx, live)
	}
	for i, it := range items {
		if errs[i] != nil {
			continue
		}
		if errs[i] = it.err; it.err == nil {
			ns[i] = int(it.length)
		}
	}
	return ns, errs
}

// room is how many bytes the caller's memory for the item holds.
func (it *getItem) room() uint64 {
	if it.parts != nil {
		return partsSize(it.parts)
	}
	return uint64(len(it.dst))
}

// partXfer is one read of an item of parts: a piece of one part at off in
// the value.
type partXfer struct {
	x   *xfer
	off uint64
}

// partReads splits the item's value over its parts: one read from replica
// m per part the value reaches into.
func (it *getItem) partReads(m *storepb.MemoryReplica, verify bool) []partXfer {
	var out []partXfer
	off := uint64(0)
	for _, p := range it.parts {
		if off >= it.length {
			break
		}
		n := min(uint64(len(p)), it.length-off)
		if n == 0 {
			continue
		}
		x := &xfer{op: engine.Read, local: p[:n], seg: m.SegmentName, remote: m.BufferAddress + off, crc: verify}
		out = append(out, partXfer{x: x, off: off})
		off += n
	}
	return out
}

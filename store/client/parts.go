package client

import (
	"context"
	"errors"
	"fmt"

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
	switch {
	case it.parts != nil:
		return partsSize(it.parts)
	case it.value != nil:
		return uint64(len(it.value))
	}
	return it.n
}

// checksum is the CRC-32C of the item's value as the master keeps it.
func (it *putItem) checksum() uint32 {
	if it.parts == nil {
		return checksum(it.value)
	}
	var sum uint32
	for _, p := range it.parts {
		sum = crc32c.Update(sum, p)
	}
	return nonZero(sum)
}

// pieces is the item's memory: its parts, or its value as one part.
func (it *putItem) pieces() [][]byte {
	if it.parts != nil {
		return it.parts
	}
	return [][]byte{it.value}
}

// engineSumMin is the size from which a piece of a value in host memory
// is checksummed by the writes that carry it, slice by slice on the
// engine's goroutines, overlapped with the transfer, instead of by the
// caller before it: the engine's slice size. A smaller piece is one slice,
// summed by one goroutine either way, and summed here it stays free to be
// coalesced with its neighbours.
const engineSumMin = 128 << 10

// summedLater reports whether a piece of n bytes at p is checksummed by
// the writes that move it: all of GPU memory, which the CPU does not read,
// and large pieces of host memory.
func summedLater(p place, n int) bool { return p.onGPU() || n >= engineSumMin }

// locate finds where the item's memory lives (places). When the client
// checksums values and some piece is summedLater, the checksum is left to
// the writes (late), with those of the other pieces taken now.
func (c *Client) locate(it *putItem) error {
	ps := it.pieces()
	it.places = make([]place, len(ps))
	for j, p := range ps {
		var err error
		if it.places[j], err = c.placeOf(p); err != nil {
			return err
		}
		it.late = it.late || (summedLater(it.places[j], len(p)) && !c.cfg.NoChecksum)
	}
	if it.late {
		it.sums = make([]uint32, len(ps))
		for j, p := range ps {
			if !summedLater(it.places[j], len(p)) {
				it.sums[j] = crc32c.Checksum(p)
			}
		}
	}
	return nil
}

// partSum is the CRC-32C of part j (of the value, whole, without parts)
// as written.
func (it *putItem) partSum(j int) uint32 {
	if it.late {
		return it.sums[j]
	}
	return crc32c.Checksum(it.pieces()[j])
}

// lateChecksum is the checksum of a late item's value as the master keeps
// it, from its parts' sums; 0 (none) when a piece went unsummed.
func (it *putItem) lateChecksum() uint32 {
	if it.unsummed {
		return 0
	}
	size, end := it.size(), uint64(0)
	var sum uint32
	for j, p := range it.pieces() {
		end += uint64(len(p))
		sum ^= crc32c.Shift(it.sums[j], size-end)
	}
	return nonZero(sum)
}

// ErrNotRegistered is the cause of the InvalidParams error of a part
// outside the memory registered with RegisterBuffer.
var ErrNotRegistered = errors.New("not in registered memory")

// checkParts reports the first non-empty part of key's that is not in
// registered memory.
func (c *Client) checkParts(op, key string, parts [][]byte) error {
	for j, p := range parts {
		if len(p) > 0 && !c.registered(p) {
			return &storepb.Error{Code: storepb.InvalidParams,
				Msg: fmt.Sprintf("%s %s: part %d (%d bytes)", op, quote(key), j, len(p)), Err: ErrNotRegistered}
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
func (c *Client) BatchPutFromParts(ctx context.Context, keys []string, parts [][][]byte, rc *ReplicateConfig) []error {
	var argErr error
	if len(parts) != len(keys) {
		argErr = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and part lists differ in number"}
	}
	return c.putItems(ctx, keys, argErr, func(i int) *putItem {
		// A nil list still marks the item as one of parts.
		if parts[i] == nil {
			return &putItem{parts: [][]byte{}}
		}
		return &putItem{parts: parts[i]}
	}, rc, false)
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
// m per part the value reaches into, and per piece of a striped replica
// that part overlaps.
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
		spans(m, off, n, func(piece *storepb.MemoryReplica, remote, at, k uint64) {
			x := &xfer{op: engine.Read, local: p[at-off : at-off+k], seg: piece.SegmentName, remote: remote, crc: verify}
			out = append(out, partXfer{x: x, off: at})
		})
		off += n
	}
	return out
}

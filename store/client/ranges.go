package client

import (
	"context"
	"fmt"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Ranged reads, get sessions and replica descriptors: what Mooncake's
// batch_get_into_multi_buffer_ranges, batch_get_session_start/end and
// batch_get_replica_desc need.

// Range is one piece of a ranged get: len(Dst) bytes of the value,
// starting at offset Src, read into Dst.
type Range struct {
	Src uint64
	Dst []byte
}

// checkRanges fails an item whose ranges reach past its value.
func (it *getItem) checkRanges() error {
	for i, r := range it.ranges {
		if r.Src > it.length || uint64(len(r.Dst)) > it.length-r.Src {
			return &storepb.Error{Code: storepb.InvalidParams,
				Msg: fmt.Sprintf("%s: range %d (%d bytes at %d) past the value's %d bytes", quote(it.key), i, len(r.Dst), r.Src, it.length)}
		}
	}
	return nil
}

// BatchGetRanges reads pieces of values: for keys[i], each of ranges[i]
// from the nearest complete replica into its Dst (registered memory
// directly, other memory through the staging buffer). It returns the
// bytes read per key (the sum of its ranges' lengths). A range past the
// end of its value fails its key with InvalidParams, nothing read. The
// pieces are not checked against the value's checksum, which covers the
// whole value only.
func (c *Client) BatchGetRanges(ctx context.Context, keys []string, ranges [][]Range) ([]int, []error) {
	ns, errs := make([]int, len(keys)), make([]error, len(keys))
	if len(ranges) != len(keys) {
		for i := range errs {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "keys and range lists differ in number"}
		}
		return ns, errs
	}
	items := make([]*getItem, len(keys))
	for i, k := range keys {
		rs := ranges[i]
		if rs == nil {
			rs = []Range{}
		}
		items[i] = &getItem{key: k, ranges: rs}
	}
	c.getMany(ctx, items)
	for i, it := range items {
		if errs[i] = it.err; it.err == nil {
			for _, r := range it.ranges {
				ns[i] += len(r.Dst)
			}
		}
	}
	return ns, errs
}

// StartGetSession looks up the replicas of keys once and keeps them for
// the lease the master grants with them, so that the reads that follow
// (BatchGetRanges, one per layer, say) skip the master. It returns an
// error per key that is not readable. With NoLeaseCache nothing is kept
// and later reads look up again.
func (c *Client) StartGetSession(ctx context.Context, keys []string) []error {
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		return fill(len(keys), err)
	}
	defer c.leave()
	items := make([]*getItem, 0, len(keys))
	for i, k := range keys {
		if k == "" {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "empty key"}
			continue
		}
		if c.leases != nil {
			// A session starts from the master's current view.
			c.leases.drop(k)
		}
		items = append(items, &getItem{key: k})
	}
	if len(items) > 0 {
		c.lookup(ctx, items)
	}
	j := 0
	for i, k := range keys {
		if k != "" {
			errs[i] = items[j].err
			j++
		}
	}
	return errs
}

// EndGetSession forgets the replicas StartGetSession kept for keys.
func (c *Client) EndGetSession(keys []string) {
	if c.leases != nil {
		c.leases.drop(keys...)
	}
}

// BatchReplicas returns each key's complete replicas, on any tier (DRAM,
// the SSD tier), or the key's error: OBJECT_NOT_FOUND for a key whose first
// put is still in flight, as for a missing one.
func (c *Client) BatchReplicas(ctx context.Context, keys []string) ([][]*storepb.Replica, []error) {
	out, errs := make([][]*storepb.Replica, len(keys)), make([]error, len(keys))
	if len(keys) == 0 {
		return out, errs
	}
	if err := c.enter(); err != nil {
		return out, fill(len(keys), err)
	}
	defer c.leave()
	req := &storepb.BatchKeyRequest{ClientId: c.id, Keys: keys}
	var resp *storepb.BatchGetReplicaListResponse
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchGetReplicaList(ctx, req)
		return err
	})
	err = batchErr(err, len(resp.GetItems()), len(keys))
	for i := range keys {
		if err != nil {
			errs[i] = err
			continue
		}
		r := resp.Items[i]
		if errs[i] = r.Result.AsError(); errs[i] == nil {
			out[i] = r.Replicas
		}
	}
	return out, errs
}

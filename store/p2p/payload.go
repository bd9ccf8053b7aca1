package p2p

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keyPrefix is where Mooncake's P2P store keeps its objects in etcd, one key
// per object.
const keyPrefix = "mooncake/checkpoint/"

// location is one copy of a shard: the segment (Transfer Engine name) that
// serves it and the absolute address of the shard's first byte there.
type location struct {
	SegmentName string `json:"segment_name"`
	Offset      uint64 `json:"offset"`
}

// shard is a contiguous piece of the object. Gold copies live in a seed's
// registered buffers; replicas in the buffers of receivers that fetched it.
type shard struct {
	Size        uint64     `json:"size"`
	Gold        []location `json:"gold"`
	ReplicaList []location `json:"replica_list"`
}

// payload is the JSON value of an object's key, field for field Mooncake's.
// The shards tile [0, Size) in order; SizeList is how the seed's buffers
// split the same bytes.
type payload struct {
	Name         string   `json:"name"`
	Size         uint64   `json:"size"`
	SizeList     []uint64 `json:"size_list"`
	MaxShardSize uint64   `json:"max_shard_size"`
	Shards       []shard  `json:"shards"`
}

// decodePayload parses a value read from etcd and checks that it describes
// a consistent object, so nothing downstream (offset arithmetic, buffer
// layout) can be driven out of range by a bad record.
func decodePayload(b []byte) (*payload, error) {
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMetadata, err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%w: payload %q: %v", ErrMetadata, p.Name, err)
	}
	return &p, nil
}

func (p *payload) validate() error {
	switch {
	case p.Name == "":
		return errors.New("no name")
	case p.Size == 0:
		return errors.New("zero size")
	case p.MaxShardSize == 0:
		return errors.New("zero max_shard_size")
	case len(p.Shards) == 0:
		return errors.New("no shards")
	case len(p.SizeList) == 0:
		return errors.New("empty size_list")
	}
	var total, carry uint64
	for _, n := range p.SizeList {
		if n == 0 {
			return errors.New("zero entry in size_list")
		}
		if total, carry = bits.Add64(total, n, 0); carry != 0 {
			return errors.New("size_list overflows")
		}
	}
	if total != p.Size {
		return fmt.Errorf("size_list sums to %d, size is %d", total, p.Size)
	}
	total = 0
	for i, s := range p.Shards {
		if s.Size == 0 || s.Size > p.MaxShardSize {
			return fmt.Errorf("shard %d: size %d (max_shard_size %d)", i, s.Size, p.MaxShardSize)
		}
		if total, carry = bits.Add64(total, s.Size, 0); carry != 0 {
			return errors.New("shard sizes overflow")
		}
		for _, l := range slices.Concat(s.Gold, s.ReplicaList) {
			if l.SegmentName == "" {
				return fmt.Errorf("shard %d: location without segment_name", i)
			}
		}
	}
	if total != p.Size {
		return fmt.Errorf("shards sum to %d, size is %d", total, p.Size)
	}
	return nil
}

// encode writes the JSON value; empty lists are written as [] rather than
// null so readers in any language see arrays.
func (p *payload) encode() string {
	q := *p
	q.Shards = slices.Clone(p.Shards)
	for i := range q.Shards {
		if q.Shards[i].Gold == nil {
			q.Shards[i].Gold = []location{}
		}
		if q.Shards[i].ReplicaList == nil {
			q.Shards[i].ReplicaList = []location{}
		}
	}
	b, err := json.Marshal(&q)
	if err != nil {
		panic(err) // plain structs of strings and integers always encode
	}
	return string(b)
}

// empty reports whether no node serves any shard any more.
func (p *payload) empty() bool {
	for _, s := range p.Shards {
		if len(s.Gold) > 0 || len(s.ReplicaList) > 0 {
			return false
		}
	}
	return true
}

// sameObject reports whether cur, read later, still describes the bytes
// that were fetched following p: same layout, never recreated, and no gold
// copy that p did not know (gold only grows when a seed publishes anew).
// Replica lists come and go without changing the bytes.
func sameObject(p, cur *record) bool {
	a, b := p.p, cur.p
	if p.created != cur.created || a.Size != b.Size || a.MaxShardSize != b.MaxShardSize ||
		!slices.Equal(a.SizeList, b.SizeList) || len(a.Shards) != len(b.Shards) {
		return false
	}
	for i := range a.Shards {
		if a.Shards[i].Size != b.Shards[i].Size {
			return false
		}
		for _, l := range b.Shards[i].Gold {
			if !slices.Contains(a.Shards[i].Gold, l) {
				return false
			}
		}
	}
	return true
}

// withoutSegment drops every location of seg from ls.
func withoutSegment(ls []location, seg string) []location {
	return slices.DeleteFunc(ls, func(l location) bool { return l.SegmentName == seg })
}

// record is a payload with the etcd revisions it was read at.
type record struct {
	p       *payload
	rev     int64 // ModRevision: compare-and-swap on it
	created int64 // CreateRevision: changes when the key is deleted and made anew
}

// meta is the Store's view of etcd. Every change is a transaction guarded
// on what was read, so concurrent seeds and receivers never lose each
// other's updates.
type meta struct {
	cli *clientv3.Client
}

func metaErr(op, name string, err error) error {
	return fmt.Errorf("%w: %s %q: %w", ErrMetadata, op, name, err)
}

// get reads an object; a nil record means it does not exist.
func (m *meta) get(ctx context.Context, name string) (*record, error) {
	resp, err := m.cli.Get(ctx, keyPrefix+name)
	if err != nil {
		return nil, metaErr("get", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	kv := resp.Kvs[0]
	return decodeRecord(name, kv.Value, kv.ModRevision, kv.CreateRevision)
}

// decodeRecord makes a record of a value of name's key and its revisions.
func decodeRecord(name string, value []byte, rev, created int64) (*record, error) {
	p, err := decodePayload(value)
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", name, err)
	}
	return &record{p: p, rev: rev, created: created}, nil
}

// watch streams the changes to name from revision rev on, until ctx ends.
func (m *meta) watch(ctx context.Context, name string, rev int64) clientv3.WatchChan {
	return m.cli.Watch(ctx, keyPrefix+name, clientv3.WithRev(rev))
}

// create writes p only if its key does not exist; false means it did.
func (m *meta) create(ctx context.Context, p *payload) (bool, error) {
	key := keyPrefix + p.Name
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, p.encode())).
		Commit()
	if err != nil {
		return false, metaErr("create", p.Name, err)
	}
	return resp.Succeeded, nil
}

// put writes p whatever was there, as a new version: the key is deleted
// first, so its create revision changes even when the seeds' addresses do
// not (bytes re-registered in place). A receiver of the old version sees
// the deletion and starts over, rather than taking the new bytes for the
// old (sameObject and claimDir go by the create revision). etcd refuses a
// delete and a put of one key in one transaction; between the two a reader
// finds no object.
func (m *meta) put(ctx context.Context, p *payload) error {
	if _, err := m.cli.Delete(ctx, keyPrefix+p.Name); err != nil {
		return metaErr("put", p.Name, err)
	}
	if _, err := m.cli.Put(ctx, keyPrefix+p.Name, p.encode()); err != nil {
		return metaErr("put", p.Name, err)
	}
	return nil
}

// swap replaces the record read at rev by p, or deletes it when p is nil,
// and returns the revision it wrote at. If someone changed the record
// since, it returns instead the record as it is now (nil if gone): a retry
// needs no second read.
func (m *meta) swap(ctx context.Context, name string, rev int64, p *payload) (written int64, cur *record, err error) {
	key := keyPrefix + name
	op := clientv3.OpDelete(key)
	if p != nil {
		op = clientv3.OpPut(key, p.encode())
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(op).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, nil, metaErr("update", name, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return 0, nil, nil
	}
	cur, err = decodeRecord(name, kvs[0].Value, kvs[0].ModRevision, kvs[0].CreateRevision)
	return 0, cur, err
}

// edit applies f to the current record until the compare-and-swap holds,
// and deletes the object once nobody serves it. f returns false when it has
// nothing to change. It returns the record it wrote (nil if none, or if it
// deleted the object), which is f's to keep. A missing object is not an
// error: there is nothing to edit.
func (m *meta) edit(ctx context.Context, name string, f func(r *record) (bool, error)) (*record, error) {
	r, err := m.get(ctx, name)
	for err == nil && r != nil {
		var changed bool
		if changed, err = f(r); err != nil || !changed {
			return nil, err
		}
		next := r.p
		if next.empty() {
			next = nil
		}
		created := r.created
		var rev int64
		if rev, r, err = m.swap(ctx, name, r.rev, next); err == nil && rev != 0 {
			if next == nil {
				return nil, nil
			}
			return &record{p: next, rev: rev, created: created}, nil
		}
		if err == nil && ctx.Err() != nil {
			err = metaErr("update", name, ctx.Err())
		}
	}
	return nil, err
}

// list reads every object whose name starts with prefix, in name order.
// Records that do not decode are skipped and reported to skip.
func (m *meta) list(ctx context.Context, prefix string, skip func(key string, err error)) ([]*payload, error) {
	resp, err := m.cli.Get(ctx, keyPrefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, metaErr("list", prefix, err)
	}
	ps := make([]*payload, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		p, err := decodePayload(kv.Value)
		if err != nil {
			skip(string(kv.Key), err)
			continue
		}
		ps = append(ps, p)
	}
	return ps, nil
}

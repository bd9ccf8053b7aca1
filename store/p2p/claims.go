package p2p

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimPrefix is where receivers fetching an object say so, and claim the
// shards they read from a seed. It is this project's, beside Mooncake's
// records (keyPrefix), which stay as Mooncake writes them.
const claimPrefix = "mooncake/p2p-claims/"

// claimTTL is how long the claims of a receiver that stopped without
// withdrawing them (it crashed, or lost etcd) keep others from reading its
// shards from a seed.
const claimTTL = 10 * time.Second

// claimDir holds the fetchers, seed claims and holdings of one version of
// an object (see claimKey), each under the lease of the pass that wrote
// it. A version is what sameObject calls one: the key's create revision
// and the seeds' copies, so a receiver never takes holdings of another
// version's bytes (an object registered anew at other addresses gets a
// directory of its own). They come first: the create revision is unique to
// the key's creation, so the directories of two objects never nest.
func claimDir(r *record) string {
	h := fnv.New64a()
	for _, sh := range r.p.Shards {
		for _, l := range sh.Gold {
			h.Write([]byte(l.SegmentName))
			h.Write(binary.LittleEndian.AppendUint64(nil, l.Offset))
		}
		h.Write([]byte{0})
	}
	return fmt.Sprintf("%s%d-%016x/%s/", claimPrefix, r.created, h.Sum64(), r.p.Name)
}

// Kinds of keys in a claim directory.
const (
	fetcherKey = 'f' // f/<segment>: a receiver in a pass
	claimedKey = 's' // s/<shard>: the segment reading that shard from a seed
	holdsKey   = 'h' // h/<segment>: the shards that receiver holds, and where
)

// claimKey is what a key below dir stands for: its kind and the segment
// or shard it names; ok is false for keys of no known form.
func claimKey(dir, key string) (kind byte, segment string, shard int, ok bool) {
	rest, found := strings.CutPrefix(key, dir)
	if !found || len(rest) < 3 || rest[1] != '/' {
		return 0, "", 0, false
	}
	switch kind, name := rest[0], rest[2:]; kind {
	case fetcherKey, holdsKey:
		return kind, name, 0, true
	case claimedKey:
		i, err := strconv.Atoi(name)
		return kind, "", i, err == nil && i >= 0
	}
	return 0, "", 0, false
}

// claims is a pass's presence in a claim directory: its lease, which holds
// its keys and is kept alive while the pass runs.
type claims struct {
	m       *meta
	dir     string
	me      string
	lease   clientv3.LeaseID
	timeout time.Duration // of the revoke on leaving
}

// join enters me as a fetcher in the claim directory dir of object name
// under a new lease, and returns the directory as it was then and the
// revision it was read at.
func (m *meta) join(ctx context.Context, name, dir, me string, timeout time.Duration) (*claims, []*mvccpb.KeyValue, int64, error) {
	c := &claims{m: m, dir: dir, me: me, timeout: timeout}
	g, err := m.cli.Grant(ctx, int64(claimTTL/time.Second))
	if err != nil {
		return nil, nil, 0, metaErr("grant claim lease", name, err)
	}
	c.lease = g.ID
	resp, err := m.cli.Txn(ctx).Then(
		clientv3.OpPut(c.dir+string(fetcherKey)+"/"+me, "", clientv3.WithLease(c.lease)),
		clientv3.OpGet(c.dir, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		c.leave(ctx)
		return nil, nil, 0, metaErr("join", name, err)
	}
	return c, resp.Responses[1].GetResponseRange().GetKvs(), resp.Header.Revision, nil
}

// claim asks for shard i: won is whether this pass reads it from a seed;
// if not, holder is who does.
func (c *claims) claim(ctx context.Context, i int) (won bool, holder string, err error) {
	key := c.dir + string(claimedKey) + "/" + strconv.Itoa(i)
	resp, err := c.m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, c.me, clientv3.WithLease(c.lease))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, "", fmt.Errorf("%w: claim shard %d: %w", ErrMetadata, i, err)
	}
	if resp.Succeeded {
		return true, c.me, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		holder = string(kvs[0].Value)
	}
	// A claim of this pass's own that it lost track of is still its own.
	return holder == c.me, holder, nil
}

// announce tells the receivers in the directory which shards this pass
// holds, and at which addresses (shard index to address). It is a plain
// put of this receiver's own key: unlike a publication in the record,
// which every receiver edits, it never waits on another's, so the others
// learn of a landed shard within one round trip to etcd. The record gets
// the same entries soon after (publish), and keeps them after the pass.
func (c *claims) announce(ctx context.Context, held map[int]uint64) error {
	b, err := json.Marshal(held)
	if err != nil {
		return err
	}
	if _, err := c.m.cli.Put(ctx, c.dir+string(holdsKey)+"/"+c.me, string(b), clientv3.WithLease(c.lease)); err != nil {
		return fmt.Errorf("%w: announce: %w", ErrMetadata, err)
	}
	return nil
}

// keepAlive renews the lease until ctx ends.
func (c *claims) keepAlive(ctx context.Context) {
	ch, err := c.m.cli.KeepAlive(ctx, c.lease)
	if err != nil {
		return // the lease runs out: others read these shards from a seed
	}
	for range ch {
	}
}

// leave withdraws the pass's fetcher key and claims, whatever ctx's state:
// its shards are published by now, or the pass failed and others must read
// them from a seed. A failed revoke leaves them to the lease's expiry.
func (c *claims) leave(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	_, _ = c.m.cli.Revoke(rctx, c.lease)
}

// watch streams the changes to the directory from revision rev on.
func (c *claims) watch(ctx context.Context, rev int64) clientv3.WatchChan {
	return c.m.cli.Watch(ctx, c.dir, clientv3.WithPrefix(), clientv3.WithRev(rev))
}

// read reads the directory as it is and the revision it was read at.
func (c *claims) read(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	resp, err := c.m.cli.Get(ctx, c.dir, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("%w: read claims: %w", ErrMetadata, err)
	}
	return resp.Kvs, resp.Header.Revision, nil
}

package p2p

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
	holdsKey   = 'h' // h/<segment>/<n>: shards that receiver holds, and where (its nth announcement)
)

// claimKey is what a key below dir stands for: its kind and the segment
// or shard it names; ok is false for keys of no known form.
func claimKey(dir, key string) (kind byte, segment string, shard int, ok bool) {
	rest, found := strings.CutPrefix(key, dir)
	if !found || len(rest) < 3 || rest[1] != '/' {
		return 0, "", 0, false
	}
	switch kind, name := rest[0], rest[2:]; kind {
	case fetcherKey:
		return kind, name, 0, true
	case holdsKey:
		// The segment name may hold slashes; the sequence number does not.
		if j := strings.LastIndexByte(name, '/'); j > 0 {
			name = name[:j]
		}
		return kind, name, 0, true
	case claimedKey:
		i, err := strconv.Atoi(name)
		return kind, "", i, err == nil && i >= 0
	}
	return 0, "", 0, false
}

// claims is a pass's presence in a claim directory: its lease, which holds
// its keys and is kept alive while the pass runs. A lease etcd no longer
// knows (it ran out while the pass could not reach etcd, or stalled) is
// replaced by a new one (renew): the pass goes on, its keys of the old one
// gone.
type claims struct {
	m       *meta
	dir     string
	me      string
	timeout time.Duration // of the revoke on leaving

	mu    sync.Mutex
	lease clientv3.LeaseID
	gen   int // how many times the lease was renewed
	seq   int // announcements made

	renewed chan struct{} // the lease was renewed: what was announced went with the old one
}

// holdsPrefix is where a receiver's announcements go in a directory.
func holdsPrefix(dir, me string) string { return dir + string(holdsKey) + "/" + me + "/" }

// current is the pass's lease now, and its generation.
func (c *claims) current() (clientv3.LeaseID, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease, c.gen
}

// renew replaces the lease gone, which etcd no longer knows, by a new one,
// and enters the fetcher key again under it. Another caller may have done
// so already: then there is nothing to do.
func (c *claims) renew(ctx context.Context, gone clientv3.LeaseID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease != gone {
		return nil
	}
	g, err := c.m.cli.Grant(ctx, int64(claimTTL/time.Second))
	if err != nil {
		return fmt.Errorf("%w: renew claim lease: %w", ErrMetadata, err)
	}
	if _, err := c.m.cli.Put(ctx, c.dir+string(fetcherKey)+"/"+c.me, "", clientv3.WithLease(g.ID)); err != nil {
		_, _ = c.m.cli.Revoke(ctx, g.ID)
		return fmt.Errorf("%w: renew claim lease: %w", ErrMetadata, err)
	}
	c.lease = g.ID
	c.gen++
	select {
	case c.renewed <- struct{}{}:
	default:
	}
	return nil
}

// withLease runs op under the pass's lease; if etcd no longer knows the
// lease, under a new one (renew), once. gen is the generation of the lease
// op last ran under.
func (c *claims) withLease(ctx context.Context, op func(clientv3.LeaseID) error) (gen int, err error) {
	l, gen := c.current()
	err = op(l)
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return gen, err
	}
	if err := c.renew(ctx, l); err != nil {
		return gen, err
	}
	l, gen = c.current()
	return gen, op(l)
}

// join enters me as a fetcher in the claim directory dir of object name
// under a new lease, and returns the directory as it was then and the
// revision it was read at. Holdings of me already there are of a pass
// before, whose lease still runs (its revoke failed; or this is a process
// restarted under the same segment name): they go, or others would read
// those shards from buffers they have not reached yet.
func (m *meta) join(ctx context.Context, name, dir, me string, timeout time.Duration) (*claims, []*mvccpb.KeyValue, int64, error) {
	c := &claims{m: m, dir: dir, me: me, timeout: timeout, renewed: make(chan struct{}, 1)}
	g, err := m.cli.Grant(ctx, int64(claimTTL/time.Second))
	if err != nil {
		return nil, nil, 0, metaErr("grant claim lease", name, err)
	}
	c.lease = g.ID
	resp, err := m.cli.Txn(ctx).Then(
		clientv3.OpPut(c.dir+string(fetcherKey)+"/"+me, "", clientv3.WithLease(c.lease)),
		clientv3.OpDelete(holdsPrefix(c.dir, me), clientv3.WithPrefix()),
		clientv3.OpGet(c.dir, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		c.leave(ctx)
		return nil, nil, 0, metaErr("join", name, err)
	}
	return c, resp.Responses[2].GetResponseRange().GetKvs(), resp.Header.Revision, nil
}

// forget deletes the fetcher and holdings keys of me in every claim
// directory: a Store starting under the segment name of a previous life
// (a process restarted on the same host and port within claimTTL) must
// not be read from for shards that life held, at addresses its new
// buffers may reuse.
func (m *meta) forget(ctx context.Context, me string) error {
	resp, err := m.cli.Get(ctx, claimPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("%w: read claims: %w", ErrMetadata, err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		j := strings.LastIndexByte(k, '/')
		if !strings.HasSuffix(k, "/"+string(fetcherKey)+"/"+me) && (j < 0 || !strings.HasSuffix(k[:j], "/"+string(holdsKey)+"/"+me)) {
			continue
		}
		if _, err := m.cli.Delete(ctx, k); err != nil {
			return fmt.Errorf("%w: forget %s: %w", ErrMetadata, k, err)
		}
	}
	return nil
}

// claim asks for the shards is, in one transaction (a nested one per
// shard): won[k] is whether this pass reads shard is[k] from a seed; if
// not, holders[k] is who does.
func (c *claims) claim(ctx context.Context, is []int) (won []bool, holders []string, err error) {
	var resp *clientv3.TxnResponse
	_, err = c.withLease(ctx, func(l clientv3.LeaseID) (err error) {
		ops := make([]clientv3.Op, len(is))
		for k, i := range is {
			key := c.dir + string(claimedKey) + "/" + strconv.Itoa(i)
			ops[k] = clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(key, c.me, clientv3.WithLease(l))},
				[]clientv3.Op{clientv3.OpGet(key)})
		}
		resp, err = c.m.cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: claim shards %v: %w", ErrMetadata, is, err)
	}
	won, holders = make([]bool, len(is)), make([]string, len(is))
	for k, r := range resp.Responses {
		t := r.GetResponseTxn()
		if t == nil || k >= len(is) {
			continue
		}
		if t.Succeeded {
			won[k], holders[k] = true, c.me
			continue
		}
		if len(t.Responses) > 0 {
			if kvs := t.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				holders[k] = string(kvs[0].Value)
			}
		}
		// A claim of this pass's own that it lost track of is still its own.
		won[k] = holders[k] == c.me
	}
	return won, holders, nil
}

// announce tells the receivers in the directory that this pass holds the
// shards of batch, and at which addresses (shard index to address). Each
// announcement is a key of its own, put once (holdsPrefix and a sequence
// number): what a receiver announces, and each other receiver is sent,
// grows with the shards it holds, not with their square. Unlike a
// publication in the record, which every receiver edits, it never waits
// on another's, so the others learn of a landed shard within one round
// trip to etcd. The record gets the same entries soon after (publish), and
// keeps them after the pass. gen is the generation of the lease the
// announcement went under: once the lease is renewed, the announcements
// of the generations before are gone.
func (c *claims) announce(ctx context.Context, batch map[int]uint64) (gen int, err error) {
	b, err := json.Marshal(batch)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	key := holdsPrefix(c.dir, c.me) + strconv.Itoa(c.seq)
	c.seq++
	c.mu.Unlock()
	gen, err = c.withLease(ctx, func(l clientv3.LeaseID) error {
		_, err := c.m.cli.Put(ctx, key, string(b), clientv3.WithLease(l))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: announce: %w", ErrMetadata, err)
	}
	return gen, nil
}

// keepAlive keeps the lease alive until ctx ends. A lease that ran out
// anyway (etcd was out of reach longer than claimTTL) is renewed, every
// second until etcd answers: meanwhile others read the shards it claimed
// from a seed.
func (c *claims) keepAlive(ctx context.Context) {
	for ctx.Err() == nil {
		l, _ := c.current()
		if ch, err := c.m.cli.KeepAlive(ctx, l); err == nil {
			for range ch {
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err := c.renew(ctx, l); err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// leave withdraws the pass's fetcher key and claims, whatever ctx's state:
// its shards are published by now, or the pass failed and others must read
// them from a seed. A failed revoke leaves them to the lease's expiry.
func (c *claims) leave(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	l, _ := c.current()
	_, _ = c.m.cli.Revoke(rctx, l)
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

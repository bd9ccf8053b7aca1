// Package ha elects one leader among several store masters through etcd,
// and lets clients find it, as Mooncake's etcd HA backend: the leader holds
// the key mooncake-store/<cluster_id>/master_view, whose value is its
// "host:port", under an etcd lease it keeps alive; followers and clients
// watch the key. When the leader dies its lease runs out and the key
// disappears; a follower's create-if-absent wins. The default lease is 3 s
// where Mooncake's is 5 s, so that a standby serves within 5 s of a
// leader's death: etcd expires a lease up to a keep-alive interval late.
//
//	l, _ := ha.Campaign(ctx, cli, "mooncake_cluster", "10.0.0.1:50051", 0)
//	// ... load state, serve ...
//	<-l.Lost() // stop serving: another master may lead now
//
// The leader's term (the etcd revision that created the key) only grows, so
// it is also the master's view version: clients remount when it changes.
package ha

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/store/masterview"
)

// DefaultTTL is the leader key's lease.
const DefaultTTL = 3 * time.Second

// ErrNoLeader is returned by Leader while no master leads the cluster.
var ErrNoLeader = masterview.ErrNoLeader

// ViewKey is the etcd key the leader holds. Clients find the leader with
// store/masterview, which does not link the election.
func ViewKey(clusterID string) string { return masterview.Key(clusterID) }

// Leader returns the leader's address and term, or ErrNoLeader.
func Leader(ctx context.Context, cli *clientv3.Client, clusterID string) (addr string, term int64, err error) {
	return masterview.Leader(ctx, cli, clusterID)
}

// Leadership is a won election. It ends when Resign is called, ctx of
// Campaign ends, or the lease cannot be kept alive; Lost is closed then.
type Leadership struct {
	cli    *clientv3.Client
	key    string
	lease  clientv3.LeaseID
	term   int64
	lost   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// Campaign blocks until this master (reachable at addr) is the leader of
// clusterID, or ctx ends. ttl is the lease (zero: DefaultTTL; etcd rounds
// it to whole seconds, at least its minimum TTL).
func Campaign(ctx context.Context, cli *clientv3.Client, clusterID, addr string, ttl time.Duration) (*Leadership, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	key := ViewKey(clusterID)
	for {
		granted := time.Now() // the lease runs from no earlier than this
		grant, err := cli.Grant(ctx, int64(max(ttl/time.Second, 1)))
		if err != nil {
			return nil, fmt.Errorf("ha: grant lease: %w", err)
		}
		txn, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, addr, clientv3.WithLease(grant.ID))).
			Commit()
		if err != nil {
			_, _ = cli.Revoke(context.WithoutCancel(ctx), grant.ID)
			return nil, fmt.Errorf("ha: campaign: %w", err)
		}
		if txn.Succeeded {
			ttl := time.Duration(grant.TTL) * time.Second
			return keep(ctx, cli, key, grant.ID, txn.Header.Revision, granted.Add(ttl), ttl)
		}
		_, _ = cli.Revoke(ctx, grant.ID)
		// Someone leads: wait for the key to go, then try again.
		if err := waitGone(ctx, cli, key); err != nil {
			return nil, err
		}
	}
}

// waitGone returns once key does not exist.
func waitGone(ctx context.Context, cli *clientv3.Client, key string) error {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("ha: read leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("ha: watch leader: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("ha: watch on the leader key ended")
}

// keep renews the lease until it cannot, and ends the leadership before
// etcd can have expired it: the lease runs out on etcd at the latest
// renewal it received plus its TTL, which is no earlier than when that
// renewal was sent plus the TTL. The leadership ends a margin before that
// (clock rates differ a little), so that a leader cut off from etcd stops
// serving before a standby can win the key: two masters never lead at
// once. (etcd's own KeepAlive counts from the answers, which arrive
// later, and checks every half second: a cut-off leader overlapped its
// successor; internal/faults TestLeaderCutOff.)
func keep(ctx context.Context, cli *clientv3.Client, key string, lease clientv3.LeaseID, term int64, expires time.Time, ttl time.Duration) (*Leadership, error) {
	kctx, cancel := context.WithCancel(ctx)
	l := &Leadership{cli: cli, key: key, lease: lease, term: term,
		lost: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer close(l.lost)
		renewLoop(kctx, cli, lease, expires, ttl)
	}()
	return l, nil
}

// renewLoop renews lease (of the given TTL, estimated to expire at
// expires) every third of its TTL and returns when the leadership must
// end: the lease is gone, ctx ended, or no renewal came back in time. It
// renews once at once: a grant that waited long for etcd may have left the
// estimate in the past, while the lease lives; a renewal answered proves
// it did when etcd received it.
func renewLoop(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, expires time.Time, ttl time.Duration) {
	margin := max(ttl/10, 50*time.Millisecond)
	for first := true; ; first = false {
		end := expires.Add(-margin)
		if !first && !time.Now().Before(end) {
			return
		}
		sent := time.Now()
		if first && !sent.Before(end) {
			end = sent.Add(max(ttl/3, 100*time.Millisecond)) // the attempt's own bound
		}
		rctx, cancel := context.WithDeadline(ctx, end)
		resp, err := cli.KeepAliveOnce(rctx, lease)
		cancel()
		next := sent.Add(max(ttl/3, 100*time.Millisecond))
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && resp.TTL <= 0:
			return // revoked or expired
		case err == nil:
			ttl = time.Duration(resp.TTL) * time.Second
			expires = sent.Add(ttl)
			margin = max(ttl/10, 50*time.Millisecond)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return
		default:
			next = time.Now().Add(100 * time.Millisecond) // try again soon
		}
		if stop := expires.Add(-margin); stop.Before(next) {
			next = stop
		}
		wait := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
		}
	}
}

// Term is the etcd revision at which this leadership began; a later
// leader's is greater.
func (l *Leadership) Term() int64 { return l.term }

// Lost is closed when the leadership ends.
func (l *Leadership) Lost() <-chan struct{} { return l.lost }

// Resign gives the leadership up at once (the key is deleted with its
// lease) and waits for the keep-alive to stop.
func (l *Leadership) Resign(ctx context.Context) error {
	l.cancel()
	<-l.done
	_, err := l.cli.Revoke(ctx, l.lease)
	if err != nil {
		return fmt.Errorf("ha: resign: %w", err)
	}
	return nil
}

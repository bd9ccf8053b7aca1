// Package masterview finds the leading store master of a cluster: under
// Mooncake's etcd HA the leader holds the key
// mooncake-store/<cluster_id>/master_view, whose value is its "host:port"
// and whose create revision is its term (the master's view version).
//
// It is the clients' half of HA, apart from the election (store/ha) so
// that a client, and libmooncake.so, reads the key without linking the
// masters' side (internal/layering enforces this).
//
//	addr, term, err := masterview.Leader(ctx, cli, "mooncake_cluster")
//	// errors.Is(err, masterview.ErrNoLeader): an election is under way
package masterview

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoLeader is returned by Leader while no master leads the cluster.
var ErrNoLeader = errors.New("masterview: no leader")

// Key is the etcd key the leader of clusterID holds.
func Key(clusterID string) string { return "mooncake-store/" + clusterID + "/master_view" }

// Leader returns the leader's address and term, or ErrNoLeader.
func Leader(ctx context.Context, cli *clientv3.Client, clusterID string) (addr string, term int64, err error) {
	resp, err := cli.Get(ctx, Key(clusterID))
	if err != nil {
		return "", 0, fmt.Errorf("masterview: read leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, ErrNoLeader
	}
	kv := resp.Kvs[0]
	return string(kv.Value), kv.CreateRevision, nil
}

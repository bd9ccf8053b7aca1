package masterview_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/masterview"
)

// Leader reads what the election writes: no leader before a campaign,
// the winner's address and term during its leadership, none after it
// resigns.
func TestLeaderFollowsElection(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, _, err = masterview.Leader(ctx, cli, "c1")
	require.ErrorIs(t, err, masterview.ErrNoLeader)
	require.ErrorIs(t, err, ha.ErrNoLeader, "the election's sentinel is the same error")

	l, err := ha.Campaign(ctx, cli, "c1", "10.0.0.1:50051", 0)
	require.NoError(t, err)
	addr, term, err := masterview.Leader(ctx, cli, "c1")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:50051", addr)
	require.Equal(t, l.Term(), term)
	require.Equal(t, masterview.Key("c1"), ha.ViewKey("c1"))

	// Another cluster's key is another key.
	_, _, err = masterview.Leader(ctx, cli, "c2")
	require.ErrorIs(t, err, masterview.ErrNoLeader)

	require.NoError(t, l.Resign(ctx))
	_, _, err = masterview.Leader(ctx, cli, "c1")
	require.ErrorIs(t, err, masterview.ErrNoLeader)
}

// Mooncake's clients and masters agree on this key; it must not drift.
func TestKeyIsMooncakes(t *testing.T) {
	require.Equal(t, "mooncake-store/mooncake_cluster/master_view", masterview.Key("mooncake_cluster"))
}

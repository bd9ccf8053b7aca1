package master

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
)

// Masters given an in-process client of the etcd in their process (as
// mooncake up's) elect, journal and fail over as over gRPC: a standby
// takes over from a leader that stopped with every acknowledged put. (A
// crash takes the process's etcd with it; a closed in-process client
// still reaches the server, so crash() does not apply.)
func TestHAWithInProcessEtcdClient(t *testing.T) {
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	require.NoError(t, err)
	defer e.Close()
	start := func() *Server {
		// No endpoints: the client is all the master has.
		s, err := Start(ServerConfig{Listen: "127.0.0.1:0", HA: &HAConfig{Client: e.Client(), ClusterID: "inproc",
			LeaderTTL: 2 * time.Second}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a := start()
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b := start()
	const n = 2000
	putMany(t, a.Service(), n)
	require.NoError(t, a.Close())
	require.Eventually(t, b.Leading, 20*time.Second, 5*time.Millisecond)
	assert.Equal(t, n, b.Service().Stats().Keys)
	ok, err := b.Service().ExistKey(fmt.Sprintf("obj-%d", n-1))
	require.NoError(t, err)
	assert.True(t, ok)
}

// A Start that fails closes the in-process client it was given, as the
// Server would have: whether it fails before dialling etcd (bad limits) or
// after (the address is taken).
func TestFailedStartClosesInProcessClient(t *testing.T) {
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	require.NoError(t, err)
	defer e.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	for _, cfg := range []ServerConfig{
		{Listen: "127.0.0.1:0", MaxConns: -1},
		{Listen: taken.Addr().String()},
	} {
		cli := e.Client()
		cfg.HA = &HAConfig{Client: cli, ClusterID: "inproc"}
		_, err := Start(cfg)
		require.Error(t, err)
		assert.Error(t, cli.Ctx().Err(), "the client was left open")
	}
}

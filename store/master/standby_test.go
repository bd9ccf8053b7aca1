package master

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// startHA starts a master of cluster in etcd. Its lease is long enough
// that a leader starved of CPU (the race detector, a loaded machine)
// still renews it while the test puts its objects: the figures are
// measured from the election, so the lease's length does not enter them.
func startHA(t *testing.T, etcd, cluster string, cold bool) *Server {
	t.Helper()
	s, err := Start(ServerConfig{Listen: "127.0.0.1:0", HA: &HAConfig{Etcd: []string{etcd}, ClusterID: cluster,
		LeaderTTL: 5 * time.Second, ColdStandby: cold}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// putMany puts n small objects through svc, a thousand records per wait.
func putMany(t *testing.T, svc *Service, n int) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, svc.MountSegment(ctx, "node", seg("1", 1<<30, 1<<30)))
	for from := 0; from < n; from += 1000 {
		svc.Ping("node") // a slow run (-race) outlasts the client TTL
		var last uint64
		for i := from; i < min(n, from+1000); i++ {
			key := fmt.Sprintf("obj-%d", i)
			_, _, err := svc.startSeq(ctx, "node", key, 64, nil, false)
			require.NoError(t, err)
			seq, err := svc.putEndSeq("node", key, 7)
			require.NoError(t, err)
			last = seq
		}
		wait, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(t, svc.durable(wait, last), "puts not durable (a standby dropped while etcd is held?)")
		cancel()
	}
}

// holdEtcd stops j writing to etcd: its puts are then durable through
// its designated standby alone. The standby is kept however late its
// acknowledgements come until dropStandbyAfter: on a loaded machine (-race,
// every package at once) one late by standbyTimeout was dropped, and the
// puts waited for etcd, held, forever.
func holdEtcd(j *etcdJournal) {
	j.mu.Lock()
	j.rep.timeout = time.Hour
	j.mu.Unlock()
	j.holdEtcd.Store(true)
}

// dropStandbyAfter makes j drop a standby silent for d again.
func dropStandbyAfter(j *etcdJournal, d time.Duration) {
	j.mu.Lock()
	j.rep.timeout = d
	j.mu.Unlock()
}

// crash takes old out as a dead process would be: it stops answering and
// cannot resign or renew its election lease, which runs out LeaderTTL on.
func crash(old *Server) {
	old.grpc.Stop()
	_ = old.etcd.Close()
}

// failoverTime crashes the leader old and returns the time from next's
// election to the first get next serves (a client polling it the whole
// time).
func failoverTime(t *testing.T, old, next *Server, key string) time.Duration {
	t.Helper()
	conn, err := grpc.NewClient(next.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	rpc := storepb.NewMasterClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	before := next.elected.Load()
	crash(old)
	for {
		r, err := rpc.GetReplicaList(ctx, &storepb.KeyRequest{Key: key})
		if err == nil && r.GetResult().AsError() == nil {
			served := time.Now()
			won := next.elected.Load()
			require.NotEqual(t, before, won, "the get was served before an election")
			return served.Sub(time.Unix(0, won))
		}
		require.NoError(t, ctx.Err(), "no get served")
	}
}

// A standby that follows the journal serves within a second of winning
// the election after its leader died (it had the service ready while the
// dead leader's lease ran out), where one loading the journal from scratch
// takes longer the larger the state. Both are measured in this run, with
// 100000 objects (10000 with -short or the race detector), and logged.
func TestWarmStandbyServesQuickly(t *testing.T) {
	n := 100000
	if testing.Short() || raceEnabled {
		n = 10000
	}
	etcd := etcdtest.Start(t)
	a := startHA(t, etcd, "warm", false)
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b := startHA(t, etcd, "warm", false) // warm standby
	start := time.Now()
	putMany(t, a.Service(), n)
	t.Logf("%d objects put (%d journal records) in %v", n, a.Service().lastSeq(), time.Since(start).Round(time.Millisecond))

	warm := failoverTime(t, a, b, fmt.Sprintf("obj-%d", n-1))
	assert.Equal(t, n, b.Service().Stats().Keys)

	c := startHA(t, etcd, "warm", true) // cold standby, same journal
	require.Eventually(t, func() bool { return c.elected.Load() == 0 }, time.Second, time.Millisecond)
	cold := failoverTime(t, b, c, fmt.Sprintf("obj-%d", n-1))
	assert.Equal(t, n, c.Service().Stats().Keys)
	t.Logf("%d objects: election to first served get: warm standby %v, cold standby %v",
		n, warm.Round(time.Millisecond), cold.Round(time.Millisecond))
	if !raceEnabled {
		assert.Less(t, warm, time.Second, "a warm standby serves within a second of its election")
	}
	if n == 100000 {
		// With 10000 objects a cold load takes about as long as the
		// election: either may come first.
		assert.Less(t, warm, cold)
	}
}

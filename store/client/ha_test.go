package client

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func startHAMaster(t *testing.T, etcd string, every int) *master.Server {
	t.Helper()
	s, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0",
		HA: &master.HAConfig{Etcd: []string{etcd}, ClusterID: "t", LeaderTTL: 3 * time.Second, SnapshotEvery: every}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startHAPair starts an etcd and two masters of cluster "t" snapshotting
// every so many records, and returns the etcd's address, the master that
// leads and the one standing by.
func startHAPair(t *testing.T, every int) (etcd string, leader, standby *master.Server) {
	t.Helper()
	etcd = etcdtest.Start(t)
	m1 := startHAMaster(t, etcd, every)
	m2 := startHAMaster(t, etcd, every)
	if leader = waitLeader(t, m1, m2); leader == m1 {
		return etcd, m1, m2
	}
	return etcd, m2, m1
}

func waitLeader(t *testing.T, ms ...*master.Server) *master.Server {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range ms {
			if m.Leading() {
				return m
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no master leads after 10s")
	return nil
}

// requireSnapshot checks that etcd holds the journal snapshot at seq and
// that it is the latest (the layout is store/master's etcdjournal.go).
func requireSnapshot(t *testing.T, etcd, clusterID string, seq uint64) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer func() { _ = cli.Close() }()
	prefix := "mooncake-store/" + clusterID + "/journal/"
	head, err := cli.Get(ctxT(t), prefix+"snap-head")
	require.NoError(t, err)
	require.Len(t, head.Kvs, 1, "no snapshot head in etcd")
	require.Equal(t, strconv.FormatUint(seq, 10), string(head.Kvs[0].Value))
	chunks, err := cli.Get(ctxT(t), fmt.Sprintf("%ssnap/%020d/", prefix, seq), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Positive(t, chunks.Count, "the snapshot head names a snapshot with no chunks")
}

// A failover loses no object whose put completed: the new leader loads the
// journal (and, with a small SnapshotEvery, a snapshot plus the log after
// it) and serves every object byte-exact; clients follow it through etcd
// without being told.
func TestFailoverLosesNothing(t *testing.T) {
	for _, every := range []int{100000, 50} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) {
			etcd, leader, standby := startHAPair(t, every)
			haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
			a := newClient(t, "", 16<<20, haCfg)
			b := newClient(t, "", 16<<20, haCfg)
			ctx := ctxT(t)

			const n = 300
			put := func(from, to int) {
				keys, vals := make([]string, 0, to-from), make([][]byte, 0, to-from)
				for i := from; i < to; i++ {
					keys, vals = append(keys, fmt.Sprintf("k%d", i)), append(vals, value(uint64(i), 1000+i))
				}
				for i, err := range a.BatchPut(ctx, keys, vals, &ReplicateConfig{Replicas: 2}) {
					require.NoError(t, err, keys[i])
				}
			}
			put(0, n)
			if every < n {
				// The puts are past SnapshotEvery records: the leader
				// writes a snapshot at its next tick. Wait for it, and
				// check etcd holds it, so the new leader loads one.
				require.Eventually(t, func() bool { return leader.SnapshotSeq() > 0 },
					10*time.Second, 10*time.Millisecond, "no snapshot written")
				requireSnapshot(t, etcd, "t", leader.SnapshotSeq())
			}
			// Some churn the journal must replay (after the snapshot, if
			// any): removals and an upsert.
			require.NoError(t, a.Remove(ctx, "k0", true))
			require.NoError(t, a.Upsert(ctx, "k1", value(999, 5000), nil))

			require.NoError(t, leader.Close())
			start := time.Now()
			require.Same(t, standby, waitLeader(t, standby))
			t.Logf("standby leads after %v", time.Since(start))
			assert.Less(t, time.Since(start), 5*time.Second)

			check := func(c *Client) {
				_, err := c.Get(ctx, "k0")
				assert.ErrorIs(t, err, storepb.ErrObjectNotFound, "k0 was removed before the failover")
				got, err := c.Get(ctx, "k1")
				require.NoError(t, err)
				require.Equal(t, value(999, 5000), got)
				keys := make([]string, 0, n)
				for i := 2; i < n; i++ {
					keys = append(keys, fmt.Sprintf("k%d", i))
				}
				vals, errs := c.BatchGet(ctx, keys)
				for i := range keys {
					require.NoError(t, errs[i], keys[i])
					require.True(t, bytes.Equal(value(uint64(i+2), 1000+i+2), vals[i]), keys[i])
				}
			}
			check(b)
			check(a)
			// The new leader takes new puts on the restored segments, which
			// never overlap the restored objects.
			put(n, n+200)
			check(b)
		})
	}
}

// Puts running through a failover either fail or are readable afterwards;
// none is acknowledged and then lost.
func TestFailoverUnderLoad(t *testing.T) {
	etcd := etcdtest.Start(t)
	m1 := startHAMaster(t, etcd, 100000)
	m2 := startHAMaster(t, etcd, 100000)
	leader := waitLeader(t, m1, m2)
	haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
	a := newClient(t, "", 32<<20, haCfg)
	b := newClient(t, "", 32<<20, haCfg)
	ctx := ctxT(t)

	var mu sync.Mutex
	var acked []int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			for i := g; ; i += 3 {
				select {
				case <-stop:
					return
				default:
				}
				if err := a.Put(ctx, fmt.Sprintf("L%d", i), value(uint64(i), 2000), &ReplicateConfig{Replicas: 2}); err == nil {
					mu.Lock()
					acked = append(acked, i)
					mu.Unlock()
				}
			}
		})
	}
	ackedN := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	// Puts are being acknowledged before the failover, and again after it:
	// the test covers puts in flight when the leader dies.
	require.Eventually(t, func() bool { return ackedN() >= 30 }, 10*time.Second, time.Millisecond)
	require.NoError(t, leader.Close())
	waitLeader(t, m1, m2)
	before := ackedN()
	require.Eventually(t, func() bool { return ackedN() >= before+30 }, 10*time.Second, time.Millisecond,
		"no put acknowledged by the new leader")
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, acked)
	for _, i := range acked {
		got, err := b.Get(ctx, fmt.Sprintf("L%d", i))
		require.NoError(t, err, "L%d was acknowledged", i)
		require.Equal(t, value(uint64(i), 2000), got)
	}
	t.Logf("%d puts acknowledged across the failover, all readable", len(acked))
}

// A call whose connection another call dropped (that one found no master
// serving) goes to the leader again: gRPC fails it with codes.Canceled,
// "the client connection is closing", which is no answer from any master.
func TestCallRetriesOnDroppedConnection(t *testing.T) {
	etcd := etcdtest.Start(t)
	waitLeader(t, startHAMaster(t, etcd, 100000))
	m, err := dialMaster(ctxT(t), &Config{Master: "etcd://" + etcd, ClusterID: "t", RPCTimeout: 10 * time.Second})
	require.NoError(t, err)
	defer m.close()

	attempts := 0
	err = m.call(ctxT(t), func(ctx context.Context, rpc storepb.MasterClient) error {
		attempts++
		if attempts == 1 {
			m.mu.Lock()
			gen := m.gen
			m.mu.Unlock()
			m.drop(gen) // as a concurrent call that met codes.Unavailable does
		}
		res, err := rpc.ExistKey(ctx, &storepb.KeyRequest{Key: "k"})
		if err != nil {
			return err
		}
		return res.AsError()
	})
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	require.Equal(t, 2, attempts)
}

// The records a new leader loads after the latest snapshot count towards
// its next snapshot: a cluster failing over more often than every
// SnapshotEvery records must still write snapshots, or every leader loads a
// longer log than the last (counted from zero each term, none was written).
func TestSnapshotCountsLoadedRecords(t *testing.T) {
	const every = 100
	etcd := etcdtest.Start(t)
	m1 := startHAMaster(t, etcd, every)
	leader := waitLeader(t, m1)
	c := newClient(t, "", 16<<20, func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" })
	ctx := ctxT(t)
	put := func(from, to int) {
		for i := from; i < to; i++ {
			require.NoError(t, c.Put(ctx, fmt.Sprintf("k%d", i), value(uint64(i), 100), nil))
		}
	}
	put(0, 30)                          // ~60 records: under every
	time.Sleep(1500 * time.Millisecond) // a snapshot tick passes
	require.Zero(t, leader.SnapshotSeq(), "a snapshot under SnapshotEvery records")

	m2 := startHAMaster(t, etcd, every)
	require.NoError(t, leader.Close())
	require.Same(t, m2, waitLeader(t, m2))
	put(30, 60) // ~60 more: under every in this term, over it in all
	require.Eventually(t, func() bool { return m2.SnapshotSeq() > 0 }, 10*time.Second, 50*time.Millisecond,
		"no snapshot after %d records in two terms", every)
}

// A caller's own short deadline passing keeps the connection to the
// master (it says nothing of it; other calls share it); the RPC timeout
// passing, or the heartbeat's probe going unanswered, drops it so that the
// next call looks the leader up again.
func TestCallDropsOnlyDoubtfulConnections(t *testing.T) {
	etcd := etcdtest.Start(t)
	waitLeader(t, startHAMaster(t, etcd, 100000))
	m, err := dialMaster(ctxT(t), &Config{Master: "etcd://" + etcd, ClusterID: "t", RPCTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	defer m.close()
	gen := func() uint64 {
		_, g, err := m.current(ctxT(t))
		require.NoError(t, err)
		return g
	}
	exist := func(ctx context.Context, rpc storepb.MasterClient) error {
		_, err := rpc.ExistKey(ctx, &storepb.KeyRequest{Key: "k"})
		return err
	}

	g0 := gen()
	short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-short.Done()
	require.Error(t, m.call(short, exist))
	require.Equal(t, g0, gen(), "a caller's deadline dropped the shared connection")

	// The call's own deadline: the master does not answer within the RPC
	// timeout (f waits it out, as a call to a master cut off would).
	require.Error(t, m.call(context.Background(), func(ctx context.Context, _ storepb.MasterClient) error {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}))
	g1 := gen()
	require.NotEqual(t, g0, g1, "the RPC timeout passed and the connection was kept")

	require.Error(t, m.call(context.Background(), func(context.Context, storepb.MasterClient) error {
		return fmt.Errorf("%w: ping", errNoAnswer)
	}))
	require.NotEqual(t, g1, gen(), "an unanswered probe kept the connection")
}

// Striped values survive a failover whole: the new leader, from the
// journal (or a snapshot and the log after it), serves them in the same
// pieces, byte-exact, and its new puts never land on a piece.
func TestFailoverKeepsStripes(t *testing.T) {
	for _, every := range []int{100000, 8} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) {
			etcd, leader, standby := startHAPair(t, every)
			haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
			var cs []*Client
			for range 4 {
				cs = append(cs, newClient(t, "", 32<<20, haCfg))
			}
			ctx := ctxT(t)
			rc := &ReplicateConfig{Stripes: 4}
			put := func(from, to int) {
				for i := from; i < to; i++ {
					require.NoError(t, cs[i%4].Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), 3<<20+i), rc))
				}
			}
			const n = 8
			put(0, n)
			before := map[string]*storepb.MemoryReplica{}
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("s%d", i)
			}
			reps, errs := cs[0].BatchReplicas(ctx, keys)
			for i, k := range keys {
				require.NoError(t, errs[i])
				require.Len(t, reps[i][0].GetMemory().GetStripes(), 4, k)
				before[k] = reps[i][0].GetMemory()
			}
			if every < n {
				require.Eventually(t, func() bool { return leader.SnapshotSeq() > 0 },
					10*time.Second, 10*time.Millisecond, "no snapshot written")
			}

			require.NoError(t, leader.Close())
			require.Same(t, standby, waitLeader(t, standby))
			check := func(c *Client, upto int) {
				for i := range upto {
					got, err := c.Get(ctx, fmt.Sprintf("s%d", i))
					require.NoError(t, err)
					require.True(t, bytes.Equal(value(uint64(i), 3<<20+i), got), "s%d", i)
				}
			}
			check(cs[1], n)
			reps, errs = cs[2].BatchReplicas(ctx, keys)
			for i, k := range keys {
				require.NoError(t, errs[i])
				m := reps[i][0].GetMemory()
				require.Len(t, m.GetStripes(), 4, k)
				for j, p := range m.GetStripes() {
					assert.Equal(t, before[k].Stripes[j].BufferAddress, p.BufferAddress, "%s piece %d", k, j)
					assert.Equal(t, before[k].Stripes[j].SegmentName, p.SegmentName, "%s piece %d", k, j)
				}
			}
			// New striped puts fill the rest of the pool next to the
			// restored pieces, and everything reads back.
			put(n, n+8)
			check(cs[3], n+8)
		})
	}
}

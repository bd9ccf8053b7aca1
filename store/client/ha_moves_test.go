package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Moves to and from an SSD tier run through a failover: the standby
// follows their records live, the new leader keeps the targets handed out
// taken and hands out moves of its own, and every object either reads
// back byte-exact or is gone (dropped by an eviction that found no SSD
// copy), never damaged.
func TestFailoverWithSSDMoves(t *testing.T) {
	etcd, leader, standby := startHAPair(t, 100000)
	haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
	node := newClient(t, "", 4<<20, haCfg, withSSD(t.TempDir(), 64<<20))
	reader := newClient(t, "", NoSegment, haCfg)
	ctx := ctxT(t)

	const n, size = 48, 256 << 10 // 12 MiB through a 4 MiB pool
	moves := func(m *master.Server) uint64 {
		st := m.Service().Stats()
		return st.Offloaded + st.Spilled
	}
	for i := range n {
		if i == n/2 {
			require.Positive(t, moves(leader), "moves before the failover")
			require.NoError(t, leader.Close())
			require.Same(t, standby, waitLeader(t, standby))
		}
		key := fmt.Sprintf("s%d", i)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, node.Put(ctx, key, value(uint64(i), size), nil))
		}, 10*time.Second, 20*time.Millisecond, key)
		time.Sleep(20 * time.Millisecond) // a put rate the node's copies keep up with
	}
	require.Eventually(t, func() bool { return moves(standby) > 0 }, 10*time.Second, 10*time.Millisecond,
		"the new leader moves nothing")
	read := 0
	for i := range n {
		got, err := reader.Get(ctx, fmt.Sprintf("s%d", i))
		if errors.Is(err, storepb.ErrObjectNotFound) {
			continue
		}
		require.NoError(t, err, "s%d", i)
		require.Equal(t, value(uint64(i), size), got, "s%d", i)
		read++
	}
	t.Logf("%d of %d objects read back; new leader: %+v", read, n, standby.Service().Stats())
	assert.Greater(t, read, n/2, "most objects survive")
}

// leadLog keeps how many moves in flight each takeover of a master
// restored, from its "master: leading" log line.
type leadLog struct {
	mu    sync.Mutex
	moves []int64
}

func (l *leadLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *leadLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "master: leading" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "moves" {
				l.mu.Lock()
				l.moves = append(l.moves, a.Value.Int64())
				l.mu.Unlock()
			}
			return true
		})
	}
	return nil
}

func (l *leadLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *leadLog) WithGroup(string) slog.Handler      { return l }

// last is what the master's last takeover restored (-1: none yet).
func (l *leadLog) last() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.moves) == 0 {
		return -1
	}
	return l.moves[len(l.moves)-1]
}

// The leader dies while the node copies objects into its SSD tier: the
// new leader restores the moves it had handed out (their targets taken),
// the node's reports end them there, every object reads back byte-exact,
// and the new leader hands out moves of its own. The failover is tried
// until one catches moves in flight (a batch's offloads are reported one
// by one over tens of milliseconds: the first try nearly always does).
func TestFailoverKeepsMovesInFlight(t *testing.T) {
	etcd := etcdtest.Start(t)
	logs := map[*master.Server]*leadLog{}
	start := func() *master.Server {
		l := &leadLog{}
		s, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Logger: slog.New(l),
			HA: &master.HAConfig{Etcd: []string{etcd}, ClusterID: "t", LeaderTTL: 3 * time.Second, SnapshotEvery: 100000}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		logs[s] = l
		return s
	}
	m1, m2 := start(), start()
	leader, standby := waitLeader(t, m1, m2), m2
	if leader == m2 {
		standby = m1
	}
	haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
	node := newClient(t, "", 64<<20, haCfg, withSSD(t.TempDir(), 128<<20))
	reader := newClient(t, "", NoSegment, haCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // past a move's expiry, below
	defer cancel()

	const batch, size = 24, 256 << 10
	var keys []string
	putBatch := func(prefix string) {
		names, vals := make([]string, batch), make([][]byte, batch)
		for i := range batch {
			names[i] = fmt.Sprintf("%s-%d", prefix, i)
			vals[i] = value(uint64(len(keys)+i), size)
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			for i, err := range node.BatchPut(ctx, names, vals, nil) {
				if !errors.Is(err, storepb.ErrObjectAlreadyExists) {
					assert.NoError(c, err, names[i])
				}
			}
		}, 10*time.Second, 20*time.Millisecond)
		keys = append(keys, names...)
	}
	// midway reports whether the leader has some of a batch's offloads
	// reported and others in flight, as they are; false once all ended.
	midway := func(before uint64) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
			switch st := leader.Service().Stats(); {
			case st.Offloaded > before && st.MovesInFlight > 0:
				return true
			case st.Offloaded >= before+batch:
				return false
			}
		}
		return false
	}
	var restored int64
	for try := 0; try < 8 && restored <= 0; try++ {
		// The leader goes once the node copies and reports: some moves
		// ended, others in flight. (Cut off before the ping's answer, the
		// node never hears of them and they wait for their expiry, 30 s.)
		before := leader.Service().Stats().Offloaded
		putBatch(fmt.Sprint("try", try))
		if !midway(before) {
			t.Logf("try %d: the offloads ended unseen", try)
			continue
		}
		require.NoError(t, leader.Close())
		require.Same(t, standby, waitLeader(t, standby))
		restored = logs[standby].last()
		t.Logf("try %d: the new leader restored %d moves in flight", try, restored)
		leader, standby = standby, start()
	}
	require.Positive(t, restored, "no failover caught a move in flight")
	// The node's reports end them. (Should the batch's offloads have gone
	// out in two pings and the second's answer been lost with the leader,
	// those wait for their expiry, 30 s.)
	ended := time.Now()
	require.Eventually(t, func() bool { return leader.Service().Stats().MovesInFlight == 0 },
		45*time.Second, 10*time.Millisecond, "the restored moves never ended")
	t.Logf("the restored moves ended after %v", time.Since(ended).Round(time.Millisecond))

	for i, k := range keys {
		got, err := reader.Get(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, value(uint64(i), size), got, k)
	}
	before := leader.Service().Stats().Offloaded
	putBatch("after")
	require.Eventually(t, func() bool { return leader.Service().Stats().Offloaded >= before+batch },
		10*time.Second, 10*time.Millisecond, "the new leader offloads nothing: %+v", leader.Service().Stats())
	for i, k := range keys {
		got, err := reader.Get(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, value(uint64(i), size), got, k)
	}
}

package master

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// startSecureHA starts a master of cluster in etcd that requires a token,
// and serves TLS with tlsCfg (zero: none), standby acknowledgements on.
func startSecureHA(t *testing.T, etcd, cluster string, tlsCfg secure.TLS) *Server {
	t.Helper()
	s, err := Start(secureHAConfig(etcd, cluster, tlsCfg))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func secureHAConfig(etcd, cluster string, tlsCfg secure.TLS) ServerConfig {
	return ServerConfig{Listen: "127.0.0.1:0", Token: "s3cret", TLS: tlsCfg, HA: &HAConfig{Etcd: []string{etcd},
		ClusterID: cluster, LeaderTTL: 5 * time.Second, TLSStandbyAcks: tlsCfg.Enabled()}}
}

// etcdJournalOf is s's journal while it leads.
func etcdJournalOf(t *testing.T, s *Server) *etcdJournal {
	t.Helper()
	j, ok := s.Service().j.(*etcdJournal)
	require.True(t, ok)
	return j
}

// waitDesignated waits until leader counts a standby's acknowledgements,
// and returns the standby's id.
func waitDesignated(t *testing.T, leader *Server) string {
	t.Helper()
	var id string
	require.Eventually(t, func() bool {
		var in bool
		id, in = etcdJournalOf(t, leader).standbyState()
		return in
	}, 20*time.Second, 5*time.Millisecond, "no standby designated")
	return id
}

// leaderAndStandby starts, in an etcd of its own, a leader of cluster and
// a warm standby, and waits until the leader designated the standby; j is
// the leader's journal.
func leaderAndStandby(t *testing.T, cluster string) (etcd string, a, b *Server, j *etcdJournal) {
	t.Helper()
	etcd = etcdtest.Start(t)
	a = startHA(t, etcd, cluster, false)
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b = startHA(t, etcd, cluster, false)
	waitDesignated(t, a)
	return etcd, a, b, etcdJournalOf(t, a)
}

// A warm standby's acknowledgements make puts durable while etcd has none
// of their records, and the standby, winning, writes them to etcd: no put
// is lost though the leader died before writing it.
// The masters require a token, which the standby presents to fetch; with
// mutual TLS it fetches over TLS, presenting its own certificate.
// With HAConfig.PeerServerName the masters verify one another for that
// name, whatever addresses they advertise: one certificate naming only it
// serves them all.
func TestStandbyAcksMakePutsDurable(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	named, err := secure.GenerateFor(t.TempDir(), peerName)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		tls  secure.TLS
		peer string
	}{"token": {}, "mutual TLS": {tls: files.ServerTLS()}, "mutual TLS, one name": {named.ServerTLS(), peerName}} {
		t.Run(name, func(t *testing.T) { testStandbyAcksMakePutsDurable(t, tc.tls, tc.peer) })
	}
}

// peerName is the one name of TestStandbyAcksMakePutsDurable's masters.
const peerName = "masters.mooncake.test"

func testStandbyAcksMakePutsDurable(t *testing.T, tlsCfg secure.TLS, peer string) {
	etcd := etcdtest.Start(t)
	start := func() *Server {
		cfg := secureHAConfig(etcd, "acks", tlsCfg)
		cfg.HA.PeerServerName = peer
		s, err := Start(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a := start()
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b := start()
	waitDesignated(t, a)

	j := etcdJournalOf(t, a)
	holdEtcd(j)
	const n = 300
	putMany(t, a.Service(), n)
	j.mu.Lock()
	inEtcd, last := j.etcdDone, j.committed
	j.mu.Unlock()
	require.Less(t, inEtcd, last, "the puts were answered from etcd")
	insync, behind := j.standbyStats()
	assert.Equal(t, 1.0, insync)
	assert.Equal(t, float64(last-inEtcd), behind)

	crash(a)
	require.Eventually(t, b.Leading, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, n, b.Service().Stats().Keys, "puts acknowledged by the standby lost in the failover")
	_, err := b.Service().ExistKey(fmt.Sprintf("obj-%d", n-1))
	require.NoError(t, err)
}

// With SyncEtcd a put waits for etcd however many standbys keep up.
func TestSyncEtcdTakesNoStandbyAcks(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func() *Server {
		s, err := Start(ServerConfig{Listen: "127.0.0.1:0", HA: &HAConfig{Etcd: []string{etcd}, ClusterID: "sync",
			LeaderTTL: 5 * time.Second, SyncEtcd: true}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a := start()
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	start()
	putMany(t, a.Service(), 10)
	j := etcdJournalOf(t, a)
	holdEtcd(j)
	svc := a.Service()
	_, _, err := svc.startSeq(t.Context(), "node", "held", 64, nil, false)
	require.NoError(t, err)
	seq, err := svc.putEndSeq("node", "held", 7)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	require.ErrorIs(t, svc.durable(ctx, seq), context.DeadlineExceeded)
	id, _ := j.standbyState()
	assert.Empty(t, id)
}

// A master other than the designated standby that wins takes the records
// acknowledged through that standby from it, and loses no put; with the
// standby gone too, it leads without them after tailWait.
func TestWinnerTakesTheStandbysTail(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(map[bool]string{false: "standby-alive", true: "standby-gone"}[gone], func(t *testing.T) {
			etcd := etcdtest.Start(t)
			a := startHA(t, etcd, "tail", false)
			require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
			b := startHA(t, etcd, "tail", false)
			waitDesignated(t, a)
			holdEtcd(etcdJournalOf(t, a))
			const n = 50
			putMany(t, a.Service(), n)
			// b stops campaigning and fetching, as a standby cut off
			// from etcd would; it still answers for its tail.
			b.cancel()
			if gone {
				require.NoError(t, b.Close())
			}
			c := startHA(t, etcd, "tail", true)
			crash(a)
			start := time.Now()
			require.Eventually(t, c.Leading, 30*time.Second, 5*time.Millisecond)
			if gone {
				assert.Zero(t, c.Service().Stats().Keys)
				assert.GreaterOrEqual(t, time.Since(start), tailWait-time.Second)
				return
			}
			assert.Equal(t, n, c.Service().Stats().Keys, "puts acknowledged through the standby lost")
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
			require.NoError(t, err)
			defer cli.Close()
			d, err := insync(t.Context(), cli, "tail")
			require.NoError(t, err)
			assert.Empty(t, d, "the new leader deletes the last designation")
		})
	}
}

// A designated standby that stops fetching is dropped: puts go on, acknowledged
// from etcd, and the designation is deleted once etcd has every record
// acknowledged through the standby.
func TestSilentStandbyDropped(t *testing.T) {
	etcd, a, b, _ := leaderAndStandby(t, "drop")
	putMany(t, a.Service(), 20)
	require.NoError(t, b.Close())

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	j := etcdJournalOf(t, a)
	require.Eventually(t, func() bool {
		id, _ := j.standbyState()
		d, err := insync(t.Context(), cli, "drop")
		return err == nil && id == "" && d == ""
	}, 20*time.Second, 10*time.Millisecond, "the silent standby is still designated")
	svc := a.Service()
	_, _, err = svc.startSeq(t.Context(), "node", "after", 64, nil, false)
	require.NoError(t, err)
	seq, err := svc.putEndSeq("node", "after", 7)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, svc.durable(ctx, seq))
	j.mu.Lock()
	defer j.mu.Unlock()
	assert.GreaterOrEqual(t, j.etcdDone, seq, "acknowledged, not in etcd, with no standby")
}

// A leader takes no acknowledgement of a position in another term's
// records, which its own may not match, and answers with its term.
func TestFetchOfAnotherTerm(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startHA(t, etcd, "term", false)
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	putMany(t, a.Service(), 5)
	j := etcdJournalOf(t, a)
	last := j.last()
	first, recs, behind, err := j.fetch(t.Context(), "x", "h:1", j.term+1, last+100, time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, last+101, first)
	assert.Empty(t, recs)
	assert.False(t, behind)
	id, _ := j.standbyState()
	assert.Empty(t, id, "designated on another term's position")

	_, _, _, err = j.fetch(t.Context(), "x", "h:1", j.term, last+1, time.Millisecond)
	require.Error(t, err, "a standby ahead of the leader in its own term")
	first, recs, _, err = j.fetch(t.Context(), "x", "h:1", j.term, last-2, time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, last-1, first)
	assert.Len(t, recs, 2)
}

// The tail drops its records when a leader of another term answers, and
// hands them over only under its own designation.
func TestTailStore(t *testing.T) {
	tl := &tailStore{id: "me", addr: "h:1", term: 7}
	term, after, _ := tl.after(10)
	assert.Equal(t, int64(7), term)
	assert.Equal(t, uint64(10), after)
	tl.fetched(7, 10, [][]byte{{}, {}, {}})
	_, after, _ = tl.after(10)
	assert.Equal(t, uint64(13), after)
	_, recs := tl.take(designation("other", 7, "h:1"))
	assert.Nil(t, recs)
	_, recs = tl.take(designation("me", 6, "h:1"))
	assert.Nil(t, recs)
	first, recs := tl.take(designation("me", 7, "h:1"))
	assert.Equal(t, uint64(11), first)
	assert.Len(t, recs, 3)

	_, after, _ = tl.after(11) // etcd brought record 11
	assert.Equal(t, uint64(13), after)
	assert.Len(t, tl.recs, 2)
	tl.fetched(7, 12, [][]byte{{}}) // not where the tail ends
	assert.Len(t, tl.recs, 2)

	tl.fetched(8, 13, nil) // a new leader answers
	assert.Empty(t, tl.recs)
	term, after, _ = tl.after(11)
	assert.Equal(t, int64(8), term)
	assert.Equal(t, uint64(11), after)

	id, addr := designee(designation("x", 3, "[::1]:50051"))
	assert.Equal(t, "x", id)
	assert.Equal(t, "[::1]:50051", addr)
	id, _ = designee("garbage")
	assert.Empty(t, id)
}

// Masters stopped together lose no put: the leader writes the records its
// standby acknowledged to etcd before it stops.
func TestCloseWritesAcknowledgedRecords(t *testing.T) {
	etcd, a, b, j := leaderAndStandby(t, "close")
	holdEtcd(j)
	const n = 100
	putMany(t, a.Service(), n)
	require.NoError(t, b.Close())
	j.holdEtcd.Store(false)
	require.NoError(t, a.Close())

	c := startHA(t, etcd, "close", true)
	require.Eventually(t, c.Leading, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, n, c.Service().Stats().Keys)
}

// Under mutual TLS a new leader asks the designated standby for its tail
// over TLS, with its own certificate and the token; a plaintext ask gets
// nothing.
func TestAskTailOverTLS(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	etcd := etcdtest.Start(t)
	a := startSecureHA(t, etcd, "tls-tail", files.ServerTLS())
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b := startSecureHA(t, etcd, "tls-tail", files.ServerTLS())
	waitDesignated(t, a)
	j := etcdJournalOf(t, a)
	holdEtcd(j)
	t.Cleanup(func() { j.holdEtcd.Store(false) })
	putMany(t, a.Service(), 10) // acknowledged through b alone

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	d, err := insync(t.Context(), cli, "tls-tail")
	require.NoError(t, err)
	require.NotEmpty(t, d)

	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, _, err = askTail(ctx, b.Addr(), d, peerConfig{token: "s3cret"})
	require.Error(t, err, "plaintext to a TLS master")
	_, tail, err := askTail(t.Context(), b.Addr(), d, a.peer)
	require.NoError(t, err)
	assert.NotEmpty(t, tail)

	// As frames, inside TLS.
	fc, closeConn, err := dialMaster(b.Addr(), a.peer)
	require.NoError(t, err)
	defer closeConn()
	_, err = storepb.NewMasterClient(fc).JournalTail(t.Context(), &storepb.JournalTailRequest{Designation: d})
	require.NoError(t, err)
	assert.True(t, fc.Framed(), "the standby did not answer frames over TLS")
	assert.Positive(t, fc.Calls())
}

// Under TLS standbys acknowledge only with TLSStandbyAcks (every master
// must be able to ask a designated one for its records): without it the
// leader designates none and puts wait for etcd; with it, a master whose
// certificate the others could not use does not start.
func TestTLSStandbyAcksOptIn(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	etcd := etcdtest.Start(t)
	start := func() *Server {
		cfg := secureHAConfig(etcd, "tls-opt-in", files.ServerTLS())
		cfg.HA.TLSStandbyAcks = false
		s, err := Start(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a := start()
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	start()
	putMany(t, a.Service(), 10)
	time.Sleep(time.Second)
	_, in := etcdJournalOf(t, a).standbyState()
	assert.False(t, in, "a standby acknowledged under TLS without TLSStandbyAcks")

	// The client certificate: valid for client authentication, naming no host.
	_, err = Start(secureHAConfig(etcd, "tls-opt-in", secure.TLS{CertFile: files.ClientCert, KeyFile: files.ClientKey, CAFile: files.CA}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TLSStandbyAcks")

	// A certificate for one name, not the address: only with that name as
	// HAConfig.PeerServerName.
	named, err := secure.GenerateFor(t.TempDir(), peerName)
	require.NoError(t, err)
	_, err = Start(secureHAConfig(etcd, "tls-opt-in", named.ServerTLS()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TLSStandbyAcks")
	cfg := secureHAConfig(etcd, "tls-opt-in", named.ServerTLS())
	cfg.HA.PeerServerName = "other." + peerName
	_, err = Start(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TLSStandbyAcks")
	cfg.HA.PeerServerName = peerName
	s, err := Start(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

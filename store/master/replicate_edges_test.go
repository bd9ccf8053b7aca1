package master

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A standby that handed its tail to a new leader acknowledges nothing more
// of the old leader's: the new leader wrote what the tail held then, and a
// put the old leader (paused past its lease, say, and not aware yet that
// it was deposed) acknowledged through the standby afterwards would be
// lost.
func TestStandbyAcksNothingAfterHandingItsTail(t *testing.T) {
	etcd, a, b, j := leaderAndStandby(t, "seal")
	holdEtcd(j)
	t.Cleanup(func() { j.holdEtcd.Store(false) }) // a's close writes them then
	putMany(t, a.Service(), 10)                   // acknowledged through b alone

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	d, err := insync(t.Context(), cli, "seal")
	require.NoError(t, err)
	require.NotEmpty(t, d)
	// A new leader takes b's tail, as takeOver does.
	_, tail, err := askTail(t.Context(), b.Addr(), d, peerConfig{})
	require.NoError(t, err)
	require.NotEmpty(t, tail)

	// a goes on: its next put must wait for etcd, which it cannot reach.
	svc := a.Service()
	_, _, err = svc.startSeq(t.Context(), "node", "late", 64, nil, false)
	require.NoError(t, err)
	seq, err := svc.putEndSeq("node", "late", 7)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	require.ErrorIs(t, svc.durable(ctx, seq), context.DeadlineExceeded,
		"acknowledged through a standby whose tail a new leader took already")
}

// inEtcd reports whether cluster's log in etcd holds record seq.
func inEtcd(t *testing.T, cli *clientv3.Client, cluster string, seq uint64) bool {
	t.Helper()
	found, err := logHas(t.Context(), cli, cluster, seq)
	require.NoError(t, err)
	return found
}

func logHas(ctx context.Context, cli *clientv3.Client, cluster string, seq uint64) (bool, error) {
	logDir := journalPrefix(cluster) + "log/"
	found := false
	err := scan(ctx, cli, logDir, clientv3.GetPrefixRangeEnd(logDir), 0, func(key string, v []byte) error {
		b, err := decodeBatch(logDir, key, v)
		if err != nil {
			return err
		}
		found = found || b.FirstSeq <= seq && seq < b.FirstSeq+uint64(len(b.Records))
		return nil
	})
	return found, err
}

// blockedAck appends a record to a's journal whose callback blocks until
// release is called (at the test's end at the latest), and returns its
// seq once the designated standby's acknowledgement is making it durable
// (the callback runs): an advance through the standby in flight. etcd has
// every record before it and is held.
func blockedAck(t *testing.T, j *etcdJournal) (seq uint64, release func()) {
	t.Helper()
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.etcdDone == j.next-1 && j.committed == j.next-1
	}, 20*time.Second, time.Millisecond)
	holdEtcd(j)
	entered, released := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	seq = j.append(&storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{
		ClientId: "other", Segment: seg("blocked", 1<<30, 1<<20)}}}, func() {
		close(entered)
		<-released
	})
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the standby did not acknowledge the record")
	}
	return seq, release
}

// advanced returns the last record committed once an advance in flight
// has ended.
func advanced(j *etcdJournal) uint64 {
	j.advMu.Lock()
	defer j.advMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.committed
}

// A leader that closes while an advance through its standby is in flight
// (the callbacks run, committed not raised yet) writes that advance's
// records to etcd before it deletes the designation: else they are
// acknowledged, in neither etcd nor a designated standby's tail.
func TestCloseWaitsForTheAdvanceInFlight(t *testing.T) {
	etcd, _, _, j := leaderAndStandby(t, "closeadv")
	seq, release := blockedAck(t, j)

	closed := make(chan struct{})
	go func() {
		j.close()
		close(closed)
	}()
	select {
	case <-closed: // without waiting for etcd: the test fails below
	case <-time.After(time.Second):
	}
	j.holdEtcd.Store(false)
	j.signal()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	// close's writer runs the advance of what lands once the one in
	// flight ends: release it once close decided.
	require.Eventually(t, func() bool {
		select {
		case <-closed:
			return true
		default:
			return inEtcd(t, cli, "closeadv", seq)
		}
	}, 20*time.Second, 5*time.Millisecond)
	release()
	<-closed
	// The advance ends (a waiter woken meanwhile, as during close's
	// delete of the designation, sees the record committed).
	if advanced(j) < seq {
		return // not acknowledged: nothing to keep
	}
	d, err := insync(t.Context(), cli, "closeadv")
	require.NoError(t, err)
	require.True(t, d != "" || inEtcd(t, cli, "closeadv", seq),
		"record %d acknowledged, not in etcd, and no standby designated for it", seq)
}

// A designated standby dropped while an advance through it is in flight
// keeps its designation until etcd has that advance's records too.
func TestDroppedStandbyKeepsDesignationForTheAdvanceInFlight(t *testing.T) {
	etcd, _, b, j := leaderAndStandby(t, "dropadv")
	seq, release := blockedAck(t, j)
	t.Cleanup(func() { j.holdEtcd.Store(false) }) // a's close writes them then
	dropStandbyAfter(j, standbyTimeout)
	require.NoError(t, b.Close()) // silent from now on
	require.Eventually(t, func() bool {
		id, _ := j.standbyState()
		return id == ""
	}, 20*time.Second, 5*time.Millisecond, "the silent standby was not dropped")
	release()
	require.GreaterOrEqual(t, advanced(j), seq)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	// Not t's context: Never may call the condition once more after it
	// returned.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Never(t, func() bool {
		d, err := insync(ctx, cli, "dropadv")
		if err != nil || d != "" {
			return false
		}
		has, err := logHas(ctx, cli, "dropadv", seq)
		return err == nil && !has
	}, time.Second, 20*time.Millisecond, "record %d acknowledged, not in etcd, and its standby's designation deleted", seq)
}

// A standby's tail is bounded: one whose state does not move (cut off from
// etcd, or here, etcd not written) stops fetching, and acknowledging, once
// it holds maxTail records, and puts wait for etcd again.
func TestStandbyTailBounded(t *testing.T) {
	old := maxTail
	t.Cleanup(func() { maxTail = old }) // after the servers' cleanups
	maxTail = 64
	_, a, b, j := leaderAndStandby(t, "bounded")
	holdEtcd(j)
	t.Cleanup(func() { j.holdEtcd.Store(false) }) // a's close writes them then
	svc := a.Service()
	require.NoError(t, svc.MountSegment(t.Context(), "node", seg("1", 1<<30, 1<<30)))
	last := putRecords(t, svc, 200)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	require.ErrorIs(t, svc.durable(ctx, last), context.DeadlineExceeded, "acknowledged by a standby with a full tail")
	b.tails.mu.Lock()
	n := len(b.tails.recs)
	b.tails.mu.Unlock()
	require.LessOrEqual(t, n, maxTail)
}

// A leader that closes after it dropped its silent standby, before etcd
// had every record acknowledged through it, writes them first: it stops
// for no fault of its own, and the standby that held them may be gone.
func TestCloseWritesRecordsOfADroppedStandby(t *testing.T) {
	etcd, a, b, j := leaderAndStandby(t, "closedrop")
	holdEtcd(j)
	putMany(t, a.Service(), 20) // acknowledged through b alone
	last := j.last()
	dropStandbyAfter(j, standbyTimeout)
	require.NoError(t, b.Close()) // b dies
	require.Eventually(t, func() bool {
		id, _ := j.standbyState()
		return id == ""
	}, 20*time.Second, 5*time.Millisecond, "the silent standby was not dropped")

	closed := make(chan struct{})
	go func() {
		j.close()
		close(closed)
	}()
	select {
	case <-closed: // without writing: the test fails below
	case <-time.After(time.Second):
	}
	j.holdEtcd.Store(false) // etcd answers again
	j.signal()
	<-closed
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	require.True(t, inEtcd(t, cli, "closedrop", last), "record %d acknowledged and lost by a leader that closed", last)
}

// A standby acknowledges while it applies etcd's records or prepares its
// service (both under its follower's lock, for as long as a large batch
// or state takes): puts wait for neither.
func TestStandbyAcksWhileApplying(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startHA(t, etcd, "applying", false)
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	f := startFollower(cli, "applying", ServiceConfig{}, fetchConfig{enabled: true},
		&tailStore{id: newStandbyID(), addr: "127.0.0.1:1"}, slog.New(slog.DiscardHandler))
	defer f.stop()
	waitDesignated(t, a)
	j := etcdJournalOf(t, a)
	holdEtcd(j)
	t.Cleanup(func() { j.holdEtcd.Store(false) }) // a's close writes them then

	svc := a.Service()
	require.NoError(t, svc.MountSegment(t.Context(), "node", seg("1", 1<<30, 1<<30)))
	f.mu.Lock() // as a long apply does
	defer f.mu.Unlock()
	last := putRecords(t, svc, 10)
	require.NotZero(t, last)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, svc.durable(ctx, last), "the puts waited for the standby's apply")
	f.tails.mu.Lock()
	held := f.tails.first + uint64(len(f.tails.recs)) - 1
	f.tails.mu.Unlock()
	require.GreaterOrEqual(t, held, last, "acknowledged records the standby does not hold")
}

// putRecords puts n objects through svc (a segment "1" of client "node"
// mounted) without waiting for their records, and returns the last one.
func putRecords(t *testing.T, svc *Service, n int) (last uint64) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("obj-%d", i)
		_, _, err := svc.startSeq(t.Context(), "node", key, 64, nil, false)
		require.NoError(t, err)
		last, err = svc.putEndSeq("node", key, 7)
		require.NoError(t, err)
	}
	return last
}

// While a standby acknowledges, the writer writes etcd behind, on a
// timer it arms at the first record after a write; the records after that
// do not wake it (writerDue). Every record still reaches etcd, with the
// writer's periodic check, which would cover a missed wakeup, an hour
// away.
func TestStandbyAcksEtcdWrittenBehind(t *testing.T) {
	defer func(d time.Duration) { standbyCheck = d }(standbyCheck)
	standbyCheck = time.Hour
	_, _, _, j := leaderAndStandby(t, "behind")
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
	for round := range 3 {
		var last uint64
		for range journalOverlap / 2 { // fewer than wake the writer by their number
			last = j.append(rec, nil)
		}
		require.NoError(t, j.wait(t.Context(), last), "round %d: acknowledged", round)
		j.mu.Lock()
		insync := j.rep.insync
		j.mu.Unlock()
		require.True(t, insync, "round %d: the standby acknowledges", round)
		require.Eventually(t, func() bool {
			j.mu.Lock()
			defer j.mu.Unlock()
			return j.etcdDone >= last
		}, 10*time.Second, time.Millisecond, "round %d: etcd has the records through %d", round, last)
		// Quiet: the writer idles until the next record wakes it.
		time.Sleep(3 * behindEvery)
	}
}

// The count of waiting records at which an append wakes a writer with a
// write in flight or a paced one pending: another write beside the one in
// flight when records wait for etcd (puts wait for them), a paced write's
// early start while a standby acknowledges.
func TestEtcdJournalWakeAt(t *testing.T) {
	var j etcdJournal
	if got := j.wakeAt(); got != journalOverlap {
		t.Errorf("records waiting for etcd: wakeAt %d, want journalOverlap %d", got, journalOverlap)
	}
	j.rep.insync = true
	if got := j.wakeAt(); got != behindBatch {
		t.Errorf("a standby acknowledging: wakeAt %d, want behindBatch %d", got, behindBatch)
	}
}

// While a standby acknowledges, etcd is written every behindEvery or once
// behindBatch records wait. With behindEvery and the writer's periodic
// check an hour away, fewer records wait acknowledged and unwritten, and
// the one that makes behindBatch wakes the writer, which writes them all.
func TestStandbyAcksEtcdWrittenPerBatch(t *testing.T) {
	// Restored after the servers stop (cleanups run last first): the
	// writer reads behindEvery on every turn.
	t.Cleanup(func(c, e time.Duration) func() {
		return func() { standbyCheck, behindEvery = c, e }
	}(standbyCheck, behindEvery))
	standbyCheck, behindEvery = time.Hour, time.Hour
	_, _, _, j := leaderAndStandby(t, "batch")
	queued := func() (queue int, etcdDone uint64) {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.queue), j.etcdDone
	}
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
	// A writer that has not written yet writes at once; after that its
	// writes are paced.
	last := j.append(rec, nil)
	require.NoError(t, j.wait(t.Context(), last))
	q, _ := queued()
	for range behindBatch - 1 - q {
		last = j.append(rec, nil)
	}
	require.NoError(t, j.wait(t.Context(), last), "acknowledged by the standby")
	time.Sleep(100 * time.Millisecond)
	q, done := queued()
	require.Equal(t, behindBatch-1, q, "records waiting")
	require.Less(t, done, last, "etcd written before behindBatch records waited")
	last = j.append(rec, nil)
	require.Eventually(t, func() bool {
		_, done := queued()
		return done >= last
	}, 10*time.Second, time.Millisecond, "etcd has the records through %d", last)
}

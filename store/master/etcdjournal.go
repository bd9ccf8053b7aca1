package master

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// The journal in etcd, under mooncake-store/<cluster_id>/journal/:
//
//	log/<first seq, 20 digits>      a JournalBatch of consecutive records
//	snap/<seq, 20 digits>/<chunk>   a snapshot of the state up to seq
//	snap-head                       the seq of the latest complete snapshot
//
// Every write is a transaction conditioned on the leader key still being
// this leader's (its create revision is the term), so a deposed leader
// that has not noticed yet cannot write: its callers get errors instead of
// acknowledgements a new leader would not honour.
const (
	maxJournalValue = 1 << 20 // etcd's default request limit is 1.5 MiB
	snapChunkObjs   = 4096
	etcdOpTimeout   = 10 * time.Second
)

func journalPrefix(clusterID string) string { return "mooncake-store/" + clusterID + "/journal/" }

func logKey(prefix string, seq uint64) string { return fmt.Sprintf("%slog/%020d", prefix, seq) }

// ErrNotLeader is the cause of a journal write or wait that failed because
// this master no longer leads: another one may have taken over, and the
// change may not survive it.
var ErrNotLeader = errors.New("master: no longer the leader")

// etcdJournal is the leader's journal: appends queue in memory, one writer
// goroutine commits them in order in batches (group commit), then runs
// their callbacks and wakes the waiters. A record is durable once it is in
// etcd, or once the standby this leader designated has it (replicate.go):
// etcd is then written behind.
type etcdJournal struct {
	cli     *clientv3.Client
	prefix  string
	viewKey string
	term    int64

	journalQueue

	// Under journalQueue.mu:
	uncommitted []entry // appended and not durable yet: committed+1..
	etcdDone    uint64  // every record through this one is in etcd
	recent      []*storepb.JournalRecord
	recentFirst uint64        // the seq of recent[0]
	appended    chan struct{} // closed at the next append; nil: nobody waits
	rep         replication
	// writerDue: the writer looks at the queue again by itself (a write
	// landing, or a paced write's turn while a standby acknowledges), so
	// an append need not wake it until wakeAt records wait.
	writerDue bool

	advMu sync.Mutex // one advance at a time: callbacks run in order

	holdEtcd atomic.Bool // tests: write nothing to etcd while set
}

var _ journal = (*etcdJournal)(nil)

// newEtcdJournal continues the journal after record last, of which the
// ones after the latest snapshot (seq snap) count towards the next one.
// standbyAcks lets a standby's acknowledgement make records durable.
func newEtcdJournal(cli *clientv3.Client, clusterID string, term int64, last, snap uint64, standbyAcks bool) *etcdJournal {
	j := &etcdJournal{cli: cli, prefix: journalPrefix(clusterID), viewKey: ha.ViewKey(clusterID), term: term}
	j.initQueue(last, snap)
	j.etcdDone, j.recentFirst = last, last+1
	j.rep.enabled, j.rep.timeout = standbyAcks, standbyTimeout
	go j.run()
	return j
}

func (j *etcdJournal) append(rec *storepb.JournalRecord, done func()) uint64 {
	j.mu.Lock()
	seq := j.next
	j.next++
	e := entry{rec, done}
	j.queue = append(j.queue, e)
	j.uncommitted = append(j.uncommitted, e)
	if j.tapping {
		j.tapped = append(j.tapped, tapped{seq, rec})
	}
	if j.rep.enabled {
		j.recent = append(j.recent, rec)
		if len(j.recent) >= 2*keepRecent {
			drop := len(j.recent) - keepRecent
			j.recent = append(j.recent[:0:0], j.recent[drop:]...)
			j.recentFirst += uint64(drop)
		}
		if j.appended != nil {
			close(j.appended)
			j.appended = nil
		}
	}
	wakeless := j.writerDue && len(j.queue) < j.wakeAt()
	j.mu.Unlock()
	if !wakeless {
		j.signal()
	}
	return seq
}

// wakeAt is how many records wait when the writer, idle or with a write in
// flight, starts a write without its own cue (a landing, a paced write's
// turn): behindBatch while a standby acknowledges, journalOverlap (another
// write beside the one in flight) when records wait for etcd. j.mu is
// held.
func (j *etcdJournal) wakeAt() int {
	if j.rep.insync {
		return behindBatch
	}
	return journalOverlap
}

// advance makes durable the records through the last one in etcd, or the
// last one the designated standby acknowledged if later: their callbacks
// run, in order, then their waiters wake.
func (j *etcdJournal) advance() {
	j.advMu.Lock()
	defer j.advMu.Unlock()
	j.mu.Lock()
	to := j.etcdDone
	if j.rep.insync {
		to = max(to, min(j.rep.acked, j.next-1))
	}
	if to <= j.committed {
		j.mu.Unlock()
		return
	}
	n := int(to - j.committed)
	batch := j.uncommitted[:n:n]
	j.uncommitted = j.uncommitted[n:]
	j.mu.Unlock()
	for _, e := range batch {
		if e.done != nil {
			e.done()
		}
	}
	j.mu.Lock()
	j.committed = to
	j.sinceSnap += n
	j.cond.Broadcast()
	j.mu.Unlock()
}

// close stops the writer; records not yet committed fail their waiters.
// Records a standby acknowledged go to etcd first (for up to
// etcdOpTimeout): masters stopped together, the standby with the leader,
// lose none.
func (j *etcdJournal) close() {
	j.mu.Lock()
	// The designations standing: the standby's whose acks count, and one
	// dropped whose records etcd may not have yet.
	r := &j.rep
	var ds []string
	if r.insync {
		ds = append(ds, designation(r.designated, j.term, r.addr))
	}
	if r.dropping != "" {
		ds = append(ds, r.dropping)
	}
	if len(ds) > 0 {
		r.insync = false // no more pacing
		to := j.ackedThroughLocked()
		j.signal()
		deadline := time.AfterFunc(etcdOpTimeout, func() {
			j.mu.Lock()
			j.cond.Broadcast()
			j.mu.Unlock()
		})
		for start := time.Now(); j.etcdDone < to && j.err == nil && time.Since(start) < etcdOpTimeout; {
			j.cond.Wait()
		}
		deadline.Stop()
		if j.etcdDone >= to && j.err == nil {
			// The next leader need not ask the standbys.
			j.mu.Unlock()
			for _, d := range ds {
				_ = j.undesignate(d)
			}
			j.mu.Lock()
		}
	}
	j.closed = true
	if j.err == nil {
		j.err = fmt.Errorf("%w: journal closed", ErrNotLeader)
	}
	j.cond.Broadcast()
	if j.appended != nil {
		close(j.appended)
		j.appended = nil
	}
	j.mu.Unlock()
	j.signal()
	<-j.done
}

// journalDepth bounds the etcd transactions in flight at once: commits
// overlap, and a large batch waits for about one transaction, not for the
// one before it too. A batch of fewer than journalOverlap records waits
// for the transaction in flight instead, and takes the records queued
// meanwhile with it: a transaction costs etcd ~100-150 µs of CPU however
// few records it holds, and small ones side by side cost more than they
// save (16 goroutines appending one record at a time: 2.8 records a
// transaction and ~60 µs a record with 4 in flight; 7.1 and ~30 µs with
// one at a time).
const (
	journalDepth   = 4
	journalOverlap = 64
)

// written is a batch whose transaction returned.
type written struct {
	first uint64
	batch []entry
	err   error
}

// run dispatches queued records to up to journalDepth concurrent writes
// (one, unless the batch is large) and advances the records in etcd
// through the batches that have landed with no gap before them. Batches
// may land out of order; a failed one fails the journal, and the records
// after it, though in etcd, are never acknowledged (a new leader loads up
// to the gap and deletes the rest). While a standby acknowledges, writes
// start at most every behindEvery unless behindBatch records wait: etcd's
// CPU is then spent on fewer, larger transactions.
func (j *etcdJournal) run() {
	defer close(j.done)
	landed := make(chan written, journalDepth)
	inflight := 0
	next := j.committed + 1 // the seq the next dispatched batch starts at
	pending := map[uint64]written{}
	tick := time.NewTicker(standbyCheck)
	defer tick.Stop()
	var lastWrite time.Time
	var later <-chan time.Time // a paced write's turn
	for {
		// Dispatch while there is room and work.
		j.mu.Lock()
		closed, failed := j.closed, j.err != nil
		var batch []entry
		if !closed && !failed && len(j.queue) > 0 && !j.holdEtcd.Load() && (inflight == 0 || inflight < journalDepth && len(j.queue) >= journalOverlap) {
			if wait := behindEvery - time.Since(lastWrite); j.rep.insync && len(j.queue) < behindBatch && wait > 0 {
				if later == nil {
					later = time.After(wait)
				}
			} else {
				batch, j.queue = j.queue, nil
			}
		}
		// Woken by a landing, or by the paced write's turn (a standby
		// that stops acknowledging wakes it: checkStandby).
		j.writerDue = len(batch) == 0 && (inflight > 0 || later != nil && j.rep.insync)
		j.mu.Unlock()
		if (closed || failed) && inflight == 0 {
			return
		}
		if len(batch) > 0 {
			first := next
			next += uint64(len(batch))
			inflight++
			lastWrite = time.Now()
			go func() { landed <- written{first, batch, j.write(first, batch)} }()
			continue
		}
		select {
		case w := <-landed:
			inflight--
			if w.err != nil {
				j.fail(fmt.Errorf("master: journal write: %w", w.err))
				continue
			}
			pending[w.first] = w
			j.mu.Lock()
			for {
				w, ok := pending[j.etcdDone+1]
				if !ok {
					break
				}
				delete(pending, w.first)
				j.etcdDone += uint64(len(w.batch))
			}
			j.cond.Broadcast() // close may wait for etcd
			j.mu.Unlock()
			j.advance()
			j.checkStandby()
		case <-later:
			later = nil
		case <-tick.C:
			j.checkStandby()
		case <-j.wake:
		}
	}
}

// write commits batch, records first.., as etcd values of at most
// maxJournalValue each.
func (j *etcdJournal) write(first uint64, batch []entry) error {
	for len(batch) > 0 {
		b := &storepb.JournalBatch{FirstSeq: first}
		size := 0
		for len(batch) > 0 && (len(b.Records) == 0 || size < maxJournalValue/2) {
			b.Records = append(b.Records, batch[0].rec)
			size += proto.Size(batch[0].rec) + 4
			batch = batch[1:]
		}
		data, err := proto.Marshal(b)
		if err != nil {
			return err
		}
		if err := j.put(logKey(j.prefix, first), string(data)); err != nil {
			return err
		}
		first += uint64(len(b.Records))
	}
	return nil
}

// put writes key=value if this is still the leader.
func (j *etcdJournal) put(key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	defer cancel()
	txn, err := j.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(j.viewKey), "=", j.term)).
		Then(clientv3.OpPut(key, value)).
		Commit()
	if err != nil {
		return err
	}
	if !txn.Succeeded {
		return fmt.Errorf("%w (term %d)", ErrNotLeader, j.term)
	}
	return nil
}

// writeSnapshot stores the state of svc and trims the log it makes
// redundant.
func (j *etcdJournal) writeSnapshot(ctx context.Context, svc *Service) (uint64, error) {
	chunks, seq := svc.snapshot(snapChunkObjs)
	if err := j.wait(ctx, seq); err != nil {
		return 0, err
	}
	j.mu.Lock()
	j.sinceSnap = int(j.committed - seq)
	j.mu.Unlock()
	dir := fmt.Sprintf("%ssnap/%020d/", j.prefix, seq)
	for i, c := range chunks {
		data, err := proto.Marshal(c)
		if err != nil {
			return 0, err
		}
		if len(data) > maxJournalValue {
			return 0, fmt.Errorf("snapshot chunk of %d bytes", len(data))
		}
		if err := j.put(fmt.Sprintf("%s%06d", dir, i), string(data)); err != nil {
			return 0, err
		}
	}
	if err := j.put(j.prefix+"snap-head", strconv.FormatUint(seq, 10)); err != nil {
		return 0, err
	}
	// Trim: older snapshots, and log batches wholly before seq (a batch
	// that reaches past seq is kept; loading skips what it already has).
	ctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	defer cancel()
	if _, err := j.cli.Delete(ctx, j.prefix+"snap/", clientv3.WithRange(dir)); err != nil {
		return 0, err
	}
	resp, err := j.cli.Get(ctx, j.prefix+"log/", clientv3.WithRange(logKey(j.prefix, seq+1)), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if n := len(resp.Kvs); n > 1 {
		// Keys sort by seq; the last one may hold records after seq.
		if _, err := j.cli.Delete(ctx, j.prefix+"log/", clientv3.WithRange(string(resp.Kvs[n-1].Key))); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

// loadJournal reads the latest snapshot and the log after it and returns
// the state and the last sequence number. The log ends at its first gap:
// batches after one were written by a leader whose earlier write failed,
// and were never acknowledged; they are deleted (the caller leads, so the
// delete is fenced by its term).
func loadJournal(ctx context.Context, cli *clientv3.Client, clusterID string, term int64) (*state, uint64, error) {
	st, last, _, err := readEtcdSnapshot(ctx, cli, clusterID, 0)
	if err != nil {
		return nil, 0, err
	}
	last, err = continueJournal(ctx, cli, clusterID, term, st, last)
	if err != nil {
		return nil, 0, err
	}
	return st, last, nil
}

// readEtcdSnapshot reads the latest snapshot as of etcd revision rev (0: now)
// into a new state, and returns it, its sequence number and the revision
// read.
func readEtcdSnapshot(ctx context.Context, cli *clientv3.Client, clusterID string, rev int64) (*state, uint64, int64, error) {
	prefix := journalPrefix(clusterID)
	st := newState()
	var last uint64
	var opts []clientv3.OpOption
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	head, err := cli.Get(ctx, prefix+"snap-head", opts...)
	if err != nil {
		return nil, 0, 0, err
	}
	if rev == 0 {
		rev = head.Header.Revision
	}
	if len(head.Kvs) > 0 {
		if last, err = strconv.ParseUint(string(head.Kvs[0].Value), 10, 64); err != nil {
			return nil, 0, 0, fmt.Errorf("master: journal snapshot head %q: %w", head.Kvs[0].Value, err)
		}
		dir := fmt.Sprintf("%ssnap/%020d/", prefix, last)
		err := scan(ctx, cli, dir, clientv3.GetPrefixRangeEnd(dir), rev, func(key string, v []byte) error {
			var c storepb.SnapshotChunk
			if err := proto.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("master: journal snapshot chunk %s: %w", key, err)
			}
			if err := st.loadChunk(&c); err != nil {
				return fmt.Errorf("master: journal snapshot chunk %s: %w", key, err)
			}
			return nil
		})
		if err != nil {
			return nil, 0, 0, err
		}
		st.snapSeq = last
	}
	return st, last, rev, nil
}

// continueJournal applies to st, whose last record is last, the records
// of the log after it, and returns the new last. The log ends at its first
// gap; with term != 0 (the caller leads) the batches after a gap are
// deleted, fenced by the term, as never acknowledged. A state older than
// the latest snapshot cannot continue (the log it needs is trimmed): the
// error is errBehindSnapshot.
func continueJournal(ctx context.Context, cli *clientv3.Client, clusterID string, term int64, st *state, last uint64) (uint64, error) {
	prefix := journalPrefix(clusterID)
	logDir := prefix + "log/"
	head, err := cli.Get(ctx, prefix+"snap-head")
	if err != nil {
		return 0, err
	}
	rev := head.Header.Revision
	if len(head.Kvs) > 0 {
		snap, err := strconv.ParseUint(string(head.Kvs[0].Value), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("master: journal snapshot head %q: %w", head.Kvs[0].Value, err)
		}
		if snap > last {
			return 0, errBehindSnapshot
		}
	}
	// The batch holding last+1 may start at or before last: begin at the
	// last batch key before last+1's.
	from := logKey(prefix, last+1)
	before, err := cli.Get(ctx, logDir, clientv3.WithRange(from), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if len(before.Kvs) > 0 {
		from = string(before.Kvs[0].Key)
	}
	gap := false
	err = scan(ctx, cli, from, clientv3.GetPrefixRangeEnd(logDir), rev, func(key string, v []byte) error {
		if gap {
			return nil
		}
		var b storepb.JournalBatch
		if err := proto.Unmarshal(v, &b); err != nil {
			return fmt.Errorf("master: journal batch %s: %w", key, err)
		}
		if want := strings.TrimPrefix(key, logDir); want != fmt.Sprintf("%020d", b.FirstSeq) {
			return fmt.Errorf("master: journal batch %s starts at %d", key, b.FirstSeq)
		}
		var err error
		if last, gap, err = applyBatch(st, &b, last); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if gap && term != 0 {
		txn, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(ha.ViewKey(clusterID)), "=", term)).
			Then(clientv3.OpDelete(logKey(prefix, last+1), clientv3.WithRange(clientv3.GetPrefixRangeEnd(logDir)))).
			Commit()
		switch {
		case err != nil:
			return 0, fmt.Errorf("master: journal: delete unacknowledged records: %w", err)
		case !txn.Succeeded:
			return 0, fmt.Errorf("%w (term %d): journal not loaded", ErrNotLeader, term)
		}
	}
	return last, nil
}

// errBehindSnapshot is a state that cannot continue: the log after it was
// trimmed by a later snapshot.
var errBehindSnapshot = errors.New("master: journal state older than the latest snapshot")

// applyBatch applies b's records after last to st; it returns the new
// last, and gap when b starts after last+1 (nothing applied).
func applyBatch(st *state, b *storepb.JournalBatch, last uint64) (uint64, bool, error) {
	for i, rec := range b.Records {
		seq := b.FirstSeq + uint64(i)
		if seq <= last {
			continue
		}
		if seq != last+1 {
			return last, true, nil
		}
		if err := st.apply(rec); err != nil {
			return last, false, fmt.Errorf("master: journal record %d: %w", seq, err)
		}
		last = seq
	}
	return last, false, nil
}

// scan visits the keys in [from, end) in order, a page at a time, as of
// etcd revision rev (0: the first page's).
func scan(ctx context.Context, cli *clientv3.Client, from, end string, rev int64, f func(key string, v []byte) error) error {
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(256),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, from, opts...)
		if err != nil {
			return err
		}
		rev = resp.Header.Revision // one consistent view across pages
		for _, kv := range resp.Kvs {
			if err := f(string(kv.Key), kv.Value); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

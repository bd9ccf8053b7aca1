package master

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/framerpc"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Standby acknowledgements. An etcd transaction costs a put ~50-100 µs on
// the critical path, and as much CPU; a standby that fetches the leader's
// records as they are appended (JournalFetch, a long poll over the frames)
// has them a round trip later. The leader designates one standby that
// keeps up, in etcd (journal/insync, fenced by its term), and from then on
// a record is durable once that standby acknowledged it (by fetching after
// it) or once it is in etcd, whichever comes first; etcd is written behind,
// every behindEvery or behindBatch records. This is MySQL's semi-synchronous
// replication, with etcd as the log of record.
//
// What makes it safe:
//   - The designated standby keeps every record acknowledged through it,
//     in its state or in its tail (records fetched that etcd had not shown
//     yet), for as long as its process lives, across reloads and restarts
//     of its following (tailStore).
//   - A new leader asks the standby named in journal/insync for its tail
//     (JournalTail, which standbys serve) and writes what etcd lacks,
//     fenced by its own term, before it loads the journal (writeTail); the
//     standby itself, winning, writes its own. Taking the tail seals it:
//     the standby acknowledges nothing more of that term, so a deposed
//     leader that has not noticed yet (a pause past its lease) cannot make
//     a put durable that the new leader never saw.
//   - The tail is bounded (maxTail): a standby that cannot trim it (cut off
//     from etcd, not from the leader) stops acknowledging when it is full,
//     and the leader drops it.
//   - A designated standby that stops acknowledging for standbyTimeout is
//     dropped: records wait for etcd again (they were being written behind
//     all along), and once etcd has every record acknowledged through it
//     (ackedThroughLocked: an advance in flight included), the designation
//     is deleted. A leader that stops writes what is left to etcd and
//     deletes its designations (the live one and one being dropped) too.
//
// Lost only when the leader dies and its designated standby is
// unreachable for tailWait with it: both within the records etcd has not
// yet, the last ~25 ms of them (behindEvery; more while etcd is slow to
// land a write). (A standby holds what it fetched as the leader
// encoded it, checking its framing only, and decodes it when a new leader
// takes it: a record a leader encoded that framed but did not decode
// would lose it and those after it, decodeTail.)
const (
	// behindBatch is how many records wait, while a standby acknowledges,
	// before etcd is written without waiting for behindEvery. Much of a
	// write's cost is fixed, in etcd and in the standbys following it:
	// with two masters under a 64 KiB put load on 2 cores, a write of 56
	// records took ~190 us and one of 512 ~700 us; written every 64
	// records, the writes overlapped half of the slowest 5% of puts, and
	// one in ten at 512.
	behindBatch    = 512
	standbyTimeout = time.Second
	// fetchWait is how long a fetch waits for a record; a standby idle
	// that long fetches again, which tells the leader it lives.
	fetchWait = 250 * time.Millisecond
	// keepRecent is how many of its latest records the leader keeps for
	// fetches; a standby further behind catches up from etcd.
	keepRecent = 1 << 14
	// maxFetch bounds the records of one answer.
	maxFetch = 1024
	// catchUp is how near the latest record a standby must be to be
	// designated.
	catchUp = 64
	// tailWait is how long a new leader tries to reach the designated
	// standby for its tail before it goes on without.
	tailWait = 5 * time.Second
)

// standbyCheck is how often the journal's writer checks its standby,
// looking at its queue too. A variable for tests, which make it long to
// show that appends wake the writer when they must.
var standbyCheck = 100 * time.Millisecond

// behindEvery is how long, after a write to etcd started, the records a
// standby has acknowledged wait for the next, unless behindBatch of them
// wait; a write in flight is waited for too (its landing wakes the writer,
// with up to journalDepth in flight once behindBatch wait). So the records
// that only the leader and its standby hold are about that old, older
// while etcd is slow to land a write. A variable for tests, which make it
// long to show that behindBatch records wake the writer.
var behindEvery = 25 * time.Millisecond

// maxTail bounds the records a standby holds that etcd has not shown it:
// one cut off from etcd, not from the leader, would otherwise fetch and
// hold every record for as long as that lasts. A full tail fetches (and
// acknowledges) nothing more: the leader drops the standby and waits for
// etcd again. A variable for tests.
var maxTail = 4 * keepRecent

func insyncKey(prefix string) string { return prefix + "insync" }

func newStandbyID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// designation is the value of journal/insync: the standby's id, the term
// of the leader that designated it, and the address it serves at.
func designation(id string, term int64, addr string) string {
	return fmt.Sprintf("%s %d %s", id, term, addr)
}

// designee is the id and address of a designation.
func designee(d string) (id, addr string) {
	f := strings.SplitN(d, " ", 3)
	if len(f) != 3 {
		return "", ""
	}
	return f[0], f[2]
}

// replication is the leader's view of its standbys (etcdJournal.mu).
type replication struct {
	enabled    bool          // standbyAcks: a designated standby's acks count
	designated string        // the standby designated, or being designated
	addr       string        // where it serves
	insync     bool          // its designation is in etcd: its acks count
	acked      uint64        // the last record it acknowledged
	lastAck    time.Time     // its last fetch
	timeout    time.Duration // standbyTimeout (tests holding etcd raise it)
	// dropTo, when not zero, is the last record acknowledged through a
	// standby dropped: the designation is deleted once etcd has it.
	dropTo   uint64
	dropping string
}

// fetch answers a standby's JournalFetch: it takes the acknowledgement,
// then returns the records after after, waiting up to wait for one.
func (j *etcdJournal) fetch(ctx context.Context, standby, addr string, term int64, after uint64, wait time.Duration) (first uint64, recs []*storepb.JournalRecord, behind bool, err error) {
	if term != j.term {
		// A position in another leader's records, which this one's may
		// not match.
		return after + 1, nil, false, nil
	}
	j.ack(standby, addr, after)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		j.mu.Lock()
		switch {
		case j.err != nil:
			err = j.err
		case !j.rep.enabled:
			err = errors.New("master: this leader takes no standby acknowledgements")
		case after >= j.next:
			err = fmt.Errorf("master: standby at record %d, leader at %d", after, j.next-1)
		case after+1 < j.recentFirst:
			behind = true
		case after+1 < j.next:
			from := int(after + 1 - j.recentFirst)
			recs = slices.Clone(j.recent[from:min(len(j.recent), from+maxFetch)])
		}
		if err != nil || behind || recs != nil {
			j.mu.Unlock()
			return after + 1, recs, behind, err
		}
		if j.appended == nil {
			j.appended = make(chan struct{})
		}
		ch := j.appended
		j.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return after + 1, nil, false, nil
		case <-ctx.Done():
			return 0, nil, false, ctx.Err()
		}
	}
}

// ack takes standby's acknowledgement of the records through after, and
// designates it if none is and it keeps up.
func (j *etcdJournal) ack(standby, addr string, after uint64) {
	j.mu.Lock()
	r := &j.rep
	var designate, advance bool
	switch {
	case !r.enabled || j.closed || j.err != nil || after >= j.next:
		// A standby "ahead" of this leader holds no position of its records.
	case r.designated == standby:
		r.acked = max(r.acked, min(after, j.next-1))
		r.lastAck = time.Now()
		advance = r.insync
	case r.designated == "" && r.dropping == "" && addr != "" && after+catchUp >= j.next-1:
		r.designated, r.addr, r.acked, r.lastAck = standby, addr, min(after, j.next-1), time.Now()
		designate = true
	}
	j.mu.Unlock()
	if designate {
		go j.designate(standby, addr)
	}
	if advance {
		j.advance()
	}
}

// designate writes standby's designation to etcd, then counts its acks.
func (j *etcdJournal) designate(standby, addr string) {
	err := j.put(insyncKey(j.prefix), designation(standby, j.term, addr))
	j.mu.Lock()
	if j.rep.designated == standby && !j.closed {
		if err == nil {
			j.rep.insync = true
		} else {
			j.rep.designated = ""
		}
	}
	j.mu.Unlock()
	if err == nil {
		j.advance()
	}
}

// checkStandby drops a designated standby that has stopped acknowledging,
// and deletes its designation once etcd has every record acknowledged
// through it. Called by the writer.
func (j *etcdJournal) checkStandby() {
	j.mu.Lock()
	r := &j.rep
	if r.designated != "" && time.Since(r.lastAck) > r.timeout && (r.acked < j.next-1 || time.Since(r.lastAck) > 2*r.timeout) {
		r.dropping, r.dropTo = designation(r.designated, j.term, r.addr), j.ackedThroughLocked()
		r.designated, r.insync = "", false
		// Records wait for etcd now: write what is queued at once.
		j.signal()
	}
	var clear string
	if r.dropping != "" && j.etcdDone >= r.dropTo && r.dropTo != ^uint64(0) {
		clear, r.dropTo = r.dropping, ^uint64(0) // one delete at a time
	}
	j.mu.Unlock()
	if clear == "" {
		return
	}
	go func() {
		err := j.undesignate(clear)
		j.mu.Lock()
		if err == nil {
			j.rep.dropping = ""
		} else {
			j.rep.dropTo = 0 // try again at the next check
		}
		j.mu.Unlock()
	}()
}

// ackedThroughLocked is the last record the designated standby's
// acknowledgements may make durable: the committed one, or a later one
// an advance in flight took from them before they stopped counting (it
// raises committed once its callbacks ran). Its designation stands until
// etcd has that record.
func (j *etcdJournal) ackedThroughLocked() uint64 {
	return max(j.committed, min(j.rep.acked, j.next-1))
}

// undesignate deletes designation d from etcd, if it stands.
func (j *etcdJournal) undesignate(d string) error {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	defer cancel()
	_, err := j.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(j.viewKey), "=", j.term),
			clientv3.Compare(clientv3.Value(insyncKey(j.prefix)), "=", d)).
		Then(clientv3.OpDelete(insyncKey(j.prefix))).
		Commit()
	return err
}

// standbyState is the designation a leader serves under, for tests and the
// admin: the standby designated and whether its acks count.
func (j *etcdJournal) standbyState() (string, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rep.designated, j.rep.insync
}

// standbyStats is 1 while a designated standby's acknowledgements count
// (0 otherwise), and how many durable records etcd does not have yet.
func (j *etcdJournal) standbyStats() (insync, behind float64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.rep.insync {
		insync = 1
	}
	return insync, float64(j.committed - min(j.etcdDone, j.committed))
}

// insync reads journal/insync: the designation of the last leader that
// made one, "" if none stands.
func insync(ctx context.Context, cli *clientv3.Client, clusterID string) (string, error) {
	resp, err := cli.Get(ctx, insyncKey(journalPrefix(clusterID)))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

// clearInsync deletes the designation of the term before: a new leader
// designates its own.
func clearInsync(ctx context.Context, cli *clientv3.Client, clusterID string, term int64) error {
	return fenced(ctx, cli, clusterID, term, clientv3.OpDelete(insyncKey(journalPrefix(clusterID))))
}

// fenced runs op if clusterID's leader is still term's.
func fenced(ctx context.Context, cli *clientv3.Client, clusterID string, term int64, op clientv3.Op) error {
	txn, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(ha.ViewKey(clusterID)), "=", term)).
		Then(op).
		Commit()
	switch {
	case err != nil:
		return err
	case !txn.Succeeded:
		return fmt.Errorf("%w (term %d)", ErrNotLeader, term)
	}
	return nil
}

// writeTail writes to etcd the records of tail that its log lacks, fenced
// by term: a standby that won has records the old leader acknowledged
// through it and had not written yet.
func writeTail(ctx context.Context, cli *clientv3.Client, clusterID string, term int64, tail map[uint64]*storepb.JournalRecord) (int, error) {
	if len(tail) == 0 {
		return 0, nil
	}
	prefix := journalPrefix(clusterID)
	logDir := prefix + "log/"
	seqs := slices.Sorted(mapsKeys(tail))
	// What etcd has from the batch holding seqs[0] on.
	from := logKey(prefix, seqs[0]+1)
	before, err := cli.Get(ctx, logDir, clientv3.WithRange(from),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if len(before.Kvs) > 0 {
		from = string(before.Kvs[0].Key)
	}
	has := map[uint64]bool{}
	err = scan(ctx, cli, from, clientv3.GetPrefixRangeEnd(logDir), 0, func(key string, v []byte) error {
		b, err := decodeBatch(logDir, key, v)
		if err != nil {
			return err
		}
		for i := range b.Records {
			has[b.FirstSeq+uint64(i)] = true
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var snap uint64
	if head, err := cli.Get(ctx, prefix+"snap-head"); err != nil {
		return 0, err
	} else if len(head.Kvs) > 0 {
		_, _ = fmt.Sscan(string(head.Kvs[0].Value), &snap)
	}
	// Each run of records etcd lacks becomes batches that start at a
	// record no batch in etcd holds: their keys are new.
	written := 0
	var b *storepb.JournalBatch
	size := 0
	flush := func() error {
		if b == nil {
			return nil
		}
		data, err := proto.Marshal(b)
		if err != nil {
			return err
		}
		if err := fenced(ctx, cli, clusterID, term, clientv3.OpPut(logKey(prefix, b.FirstSeq), string(data))); err != nil {
			return err
		}
		written += len(b.Records)
		b, size = nil, 0
		return nil
	}
	for _, seq := range seqs {
		if has[seq] || seq <= snap {
			if err := flush(); err != nil {
				return written, err
			}
			continue
		}
		if b != nil && (b.FirstSeq+uint64(len(b.Records)) != seq || size >= maxJournalValue/2) {
			if err := flush(); err != nil {
				return written, err
			}
		}
		if b == nil {
			b = &storepb.JournalBatch{FirstSeq: seq}
		}
		b.Records = append(b.Records, tail[seq])
		size += proto.Size(tail[seq]) + 4
	}
	return written, flush()
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fetchConfig is how a follower reaches the leader to fetch its records.
type fetchConfig struct {
	enabled bool // fetch (not with SyncEtcd)
	peer    peerConfig
}

// peerConfig is how a master dials the others (a standby its leader, a new
// leader the standby the last one designated): the token they require,
// and TLS when they serve it.
type peerConfig struct {
	token string
	tls   *tls.Config // nil: plaintext
}

// fetchLoop fetches the leader's records while ctx lasts. Failures for
// over 10 s on end are a warning at most once a minute (a standby that
// cannot fetch, say for a certificate the leader refuses, acknowledges
// nothing, and every put waits for etcd); shorter ones, as at a leader's
// change, debug.
func (f *follower) fetchLoop(ctx context.Context) {
	var warned, failing time.Time
	for ctx.Err() == nil {
		began := time.Now()
		if err := f.fetchFromLeader(ctx); err != nil && ctx.Err() == nil {
			if now := time.Now(); failing.IsZero() || now.Sub(began) > 10*time.Second {
				failing = now // the first failure, or fetching worked meanwhile
			}
			if time.Since(failing) > 10*time.Second && time.Since(warned) >= time.Minute {
				warned = time.Now()
				f.log.Warn("master: standby: fetching the leader's records failed: puts wait for etcd until it does", "err", err)
			} else {
				f.log.Debug("master: standby: fetching the leader's records", "err", err)
			}
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

// dialMaster dials another master at addr as p says, for the calls
// masters make to each other: as frames, inside TLS with p.tls (gRPC for
// a master without them). close ends the connection.
func dialMaster(addr string, p peerConfig) (fc *framerpc.Conn, close func(), err error) {
	creds := insecure.NewCredentials()
	if p.tls != nil {
		creds = credentials.NewTLS(p.tls)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	var perRPC []credentials.PerRPCCredentials
	if p.token != "" {
		perRPC = append(perRPC, secure.PerRPC(p.token))
		opts = append(opts, grpc.WithPerRPCCredentials(perRPC[0]))
	}
	gc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, nil, err
	}
	fc = framerpc.NewConn(framerpc.ConnConfig{Addr: addr, GRPC: gc, Creds: perRPC, TLS: p.tls, DialTimeout: 2 * time.Second})
	return fc, func() { _ = fc.Close(); _ = gc.Close() }, nil
}

// fetchFromLeader fetches from the leader of the moment until an error.
func (f *follower) fetchFromLeader(ctx context.Context) error {
	addr, _, err := ha.Leader(ctx, f.cli, f.clusterID)
	if err != nil {
		return err
	}
	fc, closeConn, err := dialMaster(addr, f.fetch.peer)
	if err != nil {
		return err
	}
	defer closeConn()
	rpc := storepb.NewMasterClient(fc)
	// A fetch the leader does not answer within fetchWait and 2 to 4
	// seconds fails: the fetches of 2 seconds share a deadline (one each
	// was a tenth of an acknowledgement's CPU).
	dl := sharedDeadline{parent: ctx}
	defer dl.stop()
	for ctx.Err() == nil {
		term, after, ok := f.fetchAfter()
		if !ok {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		cctx := dl.get(time.Now(), fetchWait+2*time.Second, fetchWait+4*time.Second)
		resp, err := rpc.JournalFetch(cctx, &storepb.JournalFetchRequest{Standby: f.tails.id, Addr: f.tails.addr, Term: term,
			After: after, WaitMs: uint32(fetchWait / time.Millisecond)})
		switch {
		case err != nil:
			return err
		case resp.Behind:
			sleep(ctx, 20*time.Millisecond) // etcd's watch catches up
		case term == 0 && len(resp.Batch) == 0:
			// Sealed, or no leader's records yet: the answer is the
			// leader's term, which drops the tail if it is another's.
			// A tail still sealed was answered by the deposed leader:
			// look the leader up again.
			if f.tails.fetched(resp.Term, after, nil) {
				return errors.New("master: standby: the leader answering was deposed")
			}
		default:
			// Held as the leader encoded them: the next fetch
			// acknowledges them, and they are decoded only when a new
			// leader takes them (decodeTail).
			first, recs, err := splitBatch(resp.Batch)
			switch {
			case err != nil:
				return fmt.Errorf("master: journal fetch: %w", err)
			case first != after+1:
				return fmt.Errorf("master: journal fetch after record %d: the answer starts at %d", after, first)
			}
			f.tails.fetched(resp.Term, after, recs)
		}
	}
	return ctx.Err()
}

// sharedDeadline is a context for the calls made in a stretch of time,
// whose deadline leaves each at least least and at most most.
type sharedDeadline struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	until  time.Time
}

func (d *sharedDeadline) get(now time.Time, least, most time.Duration) context.Context {
	if d.ctx == nil || d.until.Sub(now) < least {
		d.stop()
		d.until = now.Add(most)
		d.ctx, d.cancel = context.WithDeadline(d.parent, d.until)
	}
	return d.ctx
}

func (d *sharedDeadline) stop() {
	if d.cancel != nil {
		d.cancel()
	}
}

// fetchAfter is the record to fetch after, and the term of the leader it
// came from: the last one held, in the state or the tail. False while
// there is no state, or while the tail is full. It takes no lock an apply
// holds: the fetch after a batch acknowledges it, and an apply of etcd's
// records (a millisecond for a thousand) or a prepare (longer) would
// delay every put waiting for that.
func (f *follower) fetchAfter() (int64, uint64, bool) {
	applied := f.applied.Load()
	if applied == 0 {
		return 0, 0, false
	}
	term, after, full := f.tails.after(applied - 1)
	return term, after, !full
}

// tailStore holds the records a standby fetched from the leader that its
// state (which follows etcd only, so that it never holds a record a later
// leader may write differently) does not have yet: records first..,
// fetched in order, the ones etcd has shown trimmed off the front. It is
// the master's, not a follower's: a standby that reloads from etcd or
// campaigns again keeps the records it acknowledged.
type tailStore struct {
	id, addr string // the standby's, as the leader designates it

	mu    sync.Mutex
	recs  [][]byte // encoded JournalRecords
	first uint64
	term  int64 // of the leader they came from
	// sealed: a new leader took the tail (take). It wrote the records the
	// tail held then, and no others: an acknowledgement of a later one to
	// term's leader, deposed but maybe not aware yet (a pause past its
	// lease), would make durable a put the new leader never saw.
	sealed bool
}

// after trims the records through last (the state has them) and returns
// the record to fetch after and its leader's term; term 0 once sealed, a
// term no leader has, so that the fetch acknowledges nothing and only
// learns the leader's term; full when the tail holds maxTail records.
func (t *tailStore) after(last uint64) (int64, uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if last >= t.first {
		n := min(last+1-t.first, uint64(len(t.recs)))
		t.recs = slices.Delete(t.recs, 0, int(n))
		t.first += n
	}
	if len(t.recs) == 0 {
		t.first = last + 1
	}
	full := len(t.recs) >= maxTail
	if t.sealed {
		return 0, t.first + uint64(len(t.recs)) - 1, full
	}
	return t.term, t.first + uint64(len(t.recs)) - 1, full
}

// fetched takes recs, the records after after that term's leader sent.
// A leader of another term than the tail's answers with its term and no
// records: the tail, the last leader's records, is dropped then, and
// fetching goes on from the state. Only a leader that serves answers, and
// a leader serves once it wrote the tail the last one designated.
func (t *tailStore) fetched(term int64, after uint64, recs [][]byte) (sealed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if term != t.term {
		t.recs, t.term, t.sealed = nil, term, false
		return false
	}
	if t.sealed {
		return true
	}
	if len(t.recs) == 0 {
		t.first = after + 1
	}
	if after+1 != t.first+uint64(len(t.recs)) {
		return false // the tail moved meanwhile
	}
	t.recs = append(t.recs, recs[:min(len(recs), max(0, maxTail-len(t.recs)))]...)
	return false
}

// take returns the tail, first record first, encoded, when d designates
// this standby for the term of its records: they are the ones
// acknowledged through it, and no other leader served since. It seals the
// tail: the standby acknowledges nothing more of that term (sealed).
func (t *tailStore) take(d string) (uint64, [][]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d != designation(t.id, t.term, t.addr) {
		return 0, nil
	}
	t.sealed = true
	if len(t.recs) == 0 {
		return 0, nil
	}
	return t.first, slices.Clone(t.recs)
}

// tailOf returns the records of the standby designated in d (journal/insync):
// this master's own, or asked of the standby, for up to tailWait; from
// the first record that does not decode on, none (decodeTail).
func tailOf(ctx context.Context, own *tailStore, d string, peer peerConfig, log *slog.Logger) (map[uint64]*storepb.JournalRecord, error) {
	id, addr := designee(d)
	var first uint64
	var raw [][]byte
	switch {
	case id == "":
		return nil, nil
	case id == own.id:
		first, raw = own.take(d)
	default:
		var err error
		first, raw, err = askTail(ctx, addr, d, peer)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.Warn("master: the standby the last leader designated did not answer: the puts acknowledged through it alone are lost",
				"standby", addr, "err", err)
			return nil, nil
		}
	}
	return decodeTail(first, raw, log), nil
}

// decodeTail decodes a standby's tail, records first.., up to the first
// one that does not decode: a standby holds records framed only
// (splitBatch), and no leader encodes one that frames but does not
// decode, but were one to, the records after it could not be written
// either (a gap: batches after one count as never acknowledged), and a
// new leader that refused to start would leave the cluster without one.
func decodeTail(first uint64, raw [][]byte, log *slog.Logger) map[uint64]*storepb.JournalRecord {
	out := make(map[uint64]*storepb.JournalRecord, len(raw))
	for i, r := range raw {
		rec := new(storepb.JournalRecord)
		if err := proto.Unmarshal(r, rec); err != nil {
			log.Error("master: a record the designated standby fetched does not decode: the puts acknowledged through it from that record on are lost",
				"seq", first+uint64(i), "records", len(raw)-i, "err", err)
			break
		}
		out[first+uint64(i)] = rec
	}
	return out
}

// splitBatch splits an encoded JournalBatch into its first_seq and its
// records, still encoded (sub-slices of b, which must not be a buffer
// reused after: protobuf's decoders copy bytes fields), checking their
// framing, and their fields' (not what nested messages hold): a standby
// holds and acknowledges them so, at a small part of a decode's cost.
func splitBatch(b []byte) (first uint64, recs [][]byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		switch {
		case n < 0:
			return 0, nil, fmt.Errorf("master: journal batch: %w", protowire.ParseError(n))
		case num > protowire.MaxValidNumber:
			return 0, nil, fmt.Errorf("master: journal batch: field number %d", num)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			first, n = protowire.ConsumeVarint(b)
		case num == 2 && typ == protowire.BytesType:
			var rec []byte
			rec, n = protowire.ConsumeBytes(b)
			if n >= 0 {
				if err := checkFields(rec); err != nil {
					return 0, nil, fmt.Errorf("master: journal batch: record %d: %w", len(recs), err)
				}
				recs = append(recs, rec[:len(rec):len(rec)])
			}
		default: // as protobuf does, a field of another wire type too
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, nil, fmt.Errorf("master: journal batch: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return first, recs, nil
}

// checkFields checks that b is a sequence of well-framed protobuf fields
// of numbers protobuf decodes.
func checkFields(b []byte) error {
	for len(b) > 0 {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d", num)
		}
		b = b[n:]
	}
	return nil
}

// encodeBatch encodes a JournalBatch of first and encoded records.
func encodeBatch(first uint64, recs [][]byte) []byte {
	size := 1 + protowire.SizeVarint(first)
	for _, r := range recs {
		size += 1 + protowire.SizeBytes(len(r))
	}
	b := make([]byte, 0, size)
	if first != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, first)
	}
	for _, r := range recs {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, r)
	}
	return b
}

// askTail asks the standby at addr for its tail under designation d,
// until it answers or tailWait passes.
func askTail(ctx context.Context, addr, d string, peer peerConfig) (first uint64, recs [][]byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, tailWait)
	defer cancel()
	fc, closeConn, err := dialMaster(addr, peer)
	if err != nil {
		return 0, nil, err
	}
	defer closeConn()
	rpc := storepb.NewMasterClient(fc)
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := rpc.JournalTail(cctx, &storepb.JournalTailRequest{Designation: d})
		ccancel()
		if err == nil {
			return splitBatch(resp.Batch)
		}
		if ctx.Err() != nil {
			return 0, nil, err
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

package master

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A standby stays warm: while it campaigns it follows the journal as the
// leader writes it (a watch on the log), applying each batch to a state
// of its own. When it wins it needs only the records its watch had not
// delivered yet, instead of loading the snapshot and the whole log after
// it, so it serves within a second of its election however large the
// state (store/master TestWarmStandbyServesQuickly measures both).
//
// Batches can land out of order (the leader has several writes in
// flight): they wait in pending until the ones before them arrive. A
// batch after a gap that never fills was not acknowledged; the new leader
// deletes it (continueJournal), and the follower forgets it then: the
// new leader's records fill the gap and take its place. A follower that
// falls behind a snapshot (its watch compacted away) loads again from the
// snapshot.
//
// A leader that dies keeps its election key until its lease runs out
// (LeaderTTL): the journal is quiet meanwhile. A follower whose journal
// has been quiet for prepareAfter builds the service from its state
// then, so that winning costs only a check that nothing came since; a
// leader that resigns (its election follows at once) or a journal still
// moving leaves the build to the winner (Server.takeOver).

// follower keeps a state up to date with the journal in etcd.
type follower struct {
	cli       *clientv3.Client
	clusterID string
	log       *slog.Logger

	svcCfg ServiceConfig // of the service prepare builds
	fetch  fetchConfig
	tails  *tailStore // the records fetched from the leader (replicate.go)

	mu      sync.Mutex
	st      *state // nil until the first load
	last    uint64
	pending map[uint64]*storepb.JournalBatch
	// prepared is the service restored from st at record preparedAt, and
	// stale once the state moves past it. restore leaves st fit to go on
	// applying records (it only drops replicas of segments gone).
	prepared   *Service
	preparedAt uint64
	// applied is last+1 while there is a state, 0 while there is none:
	// for fetching from the leader, whose acknowledgements must not wait
	// for an apply or a prepare under mu.
	applied atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// prepareAfter is how long the journal must be quiet before a follower
// builds the service from its state.
const prepareAfter = 200 * time.Millisecond

// startFollower follows clusterID's journal until stop; cfg configures
// the services it prepares, fc its fetching from the leader into tails.
func startFollower(cli *clientv3.Client, clusterID string, cfg ServiceConfig, fc fetchConfig, tails *tailStore, log *slog.Logger) *follower {
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{cli: cli, clusterID: clusterID, svcCfg: cfg, fetch: fc, tails: tails, log: log, cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { f.run(ctx) })
	if fc.enabled {
		wg.Go(func() { f.fetchLoop(ctx) })
	}
	go func() {
		wg.Wait()
		close(f.done)
	}()
	return f
}

// stop ends the follower and hands its state over: nil when it had none
// yet; with the service prepared from it at record preparedAt, if any.
// The follower is not used after.
func (f *follower) stop() (st *state, last uint64, prepared *Service, preparedAt uint64) {
	f.cancel()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	st, last, prepared, preparedAt = f.st, f.last, f.prepared, f.preparedAt
	f.st, f.prepared = nil, nil
	f.applied.Store(0)
	if prepared != nil && preparedAt != last {
		prepared = nil
	}
	return st, last, prepared, preparedAt
}

// prepare builds the service from the state, unless built already at
// this record.
func (f *follower) prepare() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st == nil || (f.prepared != nil && f.preparedAt == f.last) {
		return
	}
	svc, err := NewService(f.svcCfg)
	if err == nil {
		err = svc.restore(f.st)
	}
	if err != nil {
		f.log.Warn("master: standby: could not prepare the service; the winner will build it", "err", err)
		f.prepared = nil
		return
	}
	f.prepared, f.preparedAt = svc, f.last
}

func (f *follower) run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := f.follow(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("master: standby: following the journal failed; loading it again", "err", err)
			f.mu.Lock()
			f.st = nil
			f.applied.Store(0)
			f.mu.Unlock()
			sleep(ctx, time.Second)
		}
	}
}

// follow loads the journal as of one revision, then applies what the
// watch from the next revision brings, until ctx ends or the watch fails.
func (f *follower) follow(ctx context.Context) error {
	st, last, rev, err := readEtcdSnapshot(ctx, f.cli, f.clusterID, 0)
	if err != nil {
		return err
	}
	prefix := journalPrefix(f.clusterID)
	logDir := prefix + "log/"
	pending := map[uint64]*storepb.JournalBatch{}
	err = scan(ctx, f.cli, logDir, clientv3.GetPrefixRangeEnd(logDir), rev, func(key string, v []byte) error {
		b, err := decodeBatch(logDir, key, v)
		if err != nil {
			return err
		}
		pending[b.FirstSeq] = b
		return nil
	})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.st, f.last, f.pending = st, last, pending
	f.applied.Store(last + 1)
	err = f.drainLocked()
	f.mu.Unlock()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := f.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	quiet := time.NewTimer(prepareAfter)
	defer quiet.Stop()
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-w:
		case <-quiet.C:
			f.prepare()
			continue
		}
		if !ok {
			return ctx.Err()
		}
		if err := resp.Err(); err != nil {
			return err
		}
		quiet.Reset(prepareAfter)
		f.mu.Lock()
		for _, ev := range resp.Events {
			if err = f.eventLocked(logDir, prefix, ev); err != nil {
				break
			}
		}
		if err == nil {
			err = f.drainLocked()
		}
		f.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// eventLocked takes one change of the journal's keys.
func (f *follower) eventLocked(logDir, prefix string, ev *clientv3.Event) error {
	key := string(ev.Kv.Key)
	switch {
	case ev.Type != clientv3.EventTypePut:
		// A trim (the records are applied or in a snapshot already), or a
		// new leader deleting the batches after a gap, never acknowledged:
		// one waiting here must not be applied when the gap fills with
		// the new leader's records.
		if seq, err := strconv.ParseUint(strings.TrimPrefix(key, logDir), 10, 64); err == nil && strings.HasPrefix(key, logDir) {
			delete(f.pending, seq)
		}
		return nil
	case strings.HasPrefix(key, logDir):
		b, err := decodeBatch(logDir, key, ev.Kv.Value)
		if err != nil {
			return err
		}
		if b.FirstSeq+uint64(len(b.Records)) > f.last+1 {
			f.pending[b.FirstSeq] = b
		}
	case key == prefix+"snap-head":
		seq, err := strconv.ParseUint(string(ev.Kv.Value), 10, 64)
		if err != nil {
			return err
		}
		if err := f.drainLocked(); err != nil {
			return err
		}
		if seq > f.last {
			// Behind the snapshot, whose log may be trimmed already.
			return errBehindSnapshot
		}
		f.st.snapSeq = seq
	}
	return nil
}

// drainLocked applies the pending batches that continue the state.
func (f *follower) drainLocked() error {
	for {
		var next *storepb.JournalBatch
		for first, b := range f.pending {
			end := first + uint64(len(b.Records)) - 1
			switch {
			case end <= f.last:
				delete(f.pending, first) // applied already
			case first <= f.last+1:
				next = b
			}
		}
		if next == nil {
			return nil
		}
		delete(f.pending, next.FirstSeq)
		last, _, err := applyBatch(f.st, next, f.last)
		if err != nil {
			return err
		}
		f.last = last
		f.applied.Store(last + 1)
	}
}

func decodeBatch(logDir, key string, v []byte) (*storepb.JournalBatch, error) {
	var b storepb.JournalBatch
	if err := proto.Unmarshal(v, &b); err != nil {
		return nil, errors.New("master: journal batch " + key + ": " + err.Error())
	}
	if want := strings.TrimPrefix(key, logDir); want != padSeq(b.FirstSeq) || len(b.Records) == 0 {
		return nil, errors.New("master: journal batch " + key + " does not start at its key")
	}
	return &b, nil
}

func padSeq(seq uint64) string {
	s := strconv.FormatUint(seq, 10)
	return strings.Repeat("0", max(0, 20-len(s))) + s
}

// refresh readies a service prepared ahead of its election to lead now:
// every client gets a fresh TTL (they could not ping it before it led),
// every object a lease and every put in flight a start from now.
func (s *Service) refresh() {
	s.segMu.Lock()
	for id := range s.clients {
		s.touchLocked(id)
	}
	s.segMu.Unlock()
	// As restore does, leases and puts in flight count from the takeover,
	// not from the prepare, which may be long before: readers of the old
	// leader may still be copying, and writers still ending their puts.
	// The eviction order follows the new leases.
	now := s.now()
	lease := now.Add(s.cfg.LeaseTTL)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if lease.After(o.lease) {
				o.lease = lease
			}
			if o.pending != nil {
				o.pending.started = now
			}
			s.reorderLocked(sh, key, o)
		}
		sh.mu.Unlock()
	}
}

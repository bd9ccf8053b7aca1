package p2p

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/engine"
)

func TestSource(t *testing.T) {
	g1, g2 := location{"g1", 1}, location{"g2", 2}
	r1, r2 := location{"r1", 3}, location{"r2", 4}
	both := shard{Gold: []location{g1, g2}, ReplicaList: []location{r1, r2}}
	cases := []struct {
		name  string
		shard shard
		tried []location
		bad   []string
		want  []location // any of
	}{
		// A replica holder, never the seed, when there is one.
		{"replicas first", both, nil, nil, []location{r1, r2}},
		// No replicas: a seed.
		{"seeds without replicas", shard{Gold: []location{g1, g2}}, nil, nil, []location{g1, g2}},
		// A source that failed this shard is not asked again while others
		// are left.
		{"not a tried one", both, []location{r1}, nil, []location{r2}},
		{"seeds once replicas failed", both, []location{r1, r2}, nil, []location{g1, g2}},
		// A segment that failed another shard comes after the seeds...
		{"bad after seeds", both, nil, []string{"r1", "r2"}, []location{g1, g2}},
		// ...but before giving up on a source never tried.
		{"bad before tried", both, []location{g1, g2, r2}, []string{"r1"}, []location{r1}},
		// Every source failed: each in turn again, seeds first.
		{"wraps to first seed", both, []location{r1, r2, g1, g2}, nil, []location{g1}},
		{"then second seed", both, []location{r1, r2, g1, g2, g1}, nil, []location{g2}},
		// Replicas only (the seed withdrew).
		{"replicas only", shard{ReplicaList: []location{r1, r2}}, []location{r1, r2, r1}, nil, []location{r2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := map[string]bool{}
			for _, b := range tc.bad {
				bad[b] = true
			}
			for range 20 {
				got, seed := source(&tc.shard, tc.tried, bad)
				if !slices.Contains(tc.want, got) {
					t.Fatalf("source = %v, want one of %v", got, tc.want)
				}
				if seed != slices.Contains(tc.shard.Gold, got) {
					t.Fatalf("source = %v, seed %v", got, seed)
				}
			}
		})
	}
}

// testSwarm is a pass over an object of n one-byte shards, with the given
// replica holders per shard, as receiver "me" with 4 workers sees it;
// nothing is read.
func testSwarm(n int, replicas map[int][]string) *swarm {
	p := &payload{Name: "obj", Size: uint64(n), SizeList: []uint64{uint64(n)}, MaxShardSize: 1}
	for i := range n {
		sh := shard{Size: 1, Gold: []location{{"seed", uint64(i)}}}
		for _, r := range replicas[i] {
			sh.ReplicaList = append(sh.ReplicaList, location{r, uint64(i)})
		}
		p.Shards = append(p.Shards, sh)
	}
	s := &Store{cfg: Config{Concurrency: 4}, name: "me"}
	return newSwarm(s, &record{p: p, rev: 1, created: 1}, newLayout([]span{{0x1000, uint64(n)}}))
}

func TestPick(t *testing.T) {
	// Take every shard that may be picked now, as workers would, and
	// start reading it.
	drain := func(w *swarm, now time.Time) (got []int, wait bool, stealAt time.Time) {
		for {
			i, wait, stealAt := w.pickLocked(now)
			if i < 0 {
				return got, wait, stealAt
			}
			w.state[i] = busy
			if w.live[i] == 0 {
				w.seedBusy++
			}
			got = append(got, i)
		}
	}
	t.Run("shared first, rarest first", func(t *testing.T) {
		w := testSwarm(4, map[int][]string{1: {"a", "b"}, 2: {"a"}, 3: {"a", "b", "c"}})
		w.informed = time.Now().Add(-time.Hour)
		w.recountLocked()
		got, _, _ := drain(w, time.Now())
		// Shared ones by rarity, then what this receiver owns of the
		// rest, one seed read at a time (three peers, four workers).
		if !slices.Equal(got[:3], []int{2, 1, 3}) {
			t.Fatalf("picked %v, want 2, 1, 3 first", got)
		}
	})
	t.Run("one probe before informed", func(t *testing.T) {
		w := testSwarm(8, nil)
		if got, wait, _ := drain(w, time.Now()); len(got) != 1 || !wait {
			t.Fatalf("picked %v (wait %v), want one shard and wait", got, wait)
		}
		// Landed, but not yet seen published: still one.
		w.seedBusy = 0
		if got, _, _ := drain(w, time.Now()); len(got) != 0 {
			t.Fatalf("picked %v before the probe was published", got)
		}
		// Published and alone: the whole seed share, four at once.
		w.informed = time.Now().Add(-time.Hour)
		if got, _, _ := drain(w, time.Now()); len(got) != 4 {
			t.Fatalf("picked %v once informed and alone, want 4", got)
		}
	})
	t.Run("owned, then steal", func(t *testing.T) {
		w := testSwarm(64, map[int][]string{})
		w.informed = time.Now().Add(-time.Hour)
		w.peers = map[string]bool{"a": true, "b": true, "c": true}
		w.view.p.Shards[0].ReplicaList = []location{{"a", 0}, {"b", 0}, {"c", 0}}
		w.recountLocked()
		w.state[0] = landed
		now := time.Now()
		var mine []int
		for {
			got, wait, stealAt := drain(w, now)
			mine = append(mine, got...)
			if !stealAt.IsZero() || !wait {
				break
			}
			w.seedBusy = 0 // each read lands before the next pick
		}
		for _, i := range mine {
			if !w.owned[i] {
				t.Fatalf("read shard %d from the seed, owned by another", i)
			}
		}
		if n := len(mine); n == 0 || n > 40 {
			t.Fatalf("owns %d of 63 shards among 4 receivers", n)
		}
		// Nothing but the others' shards left: they are taken once this
		// receiver has waited, one at a time.
		w.seedBusy = 0
		w.slowRead, w.slowPublish = 10*time.Millisecond, 20*time.Millisecond
		_, wait, stealAt := w.pickLocked(now)
		if want := now.Add(60*time.Millisecond + publishDelay); !wait || !stealAt.Equal(want) {
			t.Fatalf("starving: wait %v until %v, want until %v", wait, stealAt, want)
		}
		got, _, _ := drain(w, stealAt)
		if len(got) != 1 || w.owned[got[0]] {
			t.Fatalf("stole %v, want one of the others' shards", got)
		}
	})
}

// TestOwnersAgree: receivers that see the same peers split the shards
// among themselves, each shard to exactly one.
func TestOwnersAgree(t *testing.T) {
	names := []string{"10.0.0.1:15001", "10.0.0.2:15001", "10.0.0.3:15001", "10.0.0.4:15001"}
	const n = 64
	owners := make([]int, n)
	for _, me := range names {
		w := testSwarm(n, nil)
		w.s.name = me
		for _, p := range names {
			if p != me {
				w.peers[p] = true
			}
		}
		// recountLocked rebuilds peers from the view: give it the peers
		// as holders of a shard nobody reads here.
		for _, p := range names {
			if p != me {
				w.view.p.Shards[0].ReplicaList = append(w.view.p.Shards[0].ReplicaList, location{p, 0})
			}
		}
		w.recountLocked()
		k := 0
		for i, o := range w.owned {
			if o {
				owners[i]++
				k++
			}
		}
		if k < n/8 {
			t.Errorf("%s owns %d of %d shards", me, k, n)
		}
	}
	for i, c := range owners {
		if c != 1 {
			t.Errorf("shard %d has %d owners", i, c)
		}
	}
}

// TestPeerDiesMidFetch: a receiver publishes a shard and crashes (its
// engine is gone, its entries stay in the record). Receivers fetching at
// the same time try it, fail over, and get every byte; once the dead
// receiver's fetch fails, it is withdrawn.
func TestPeerDiesMidFetch(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Transport: "tcp", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	dying := newNode(t, etcd, func(c *Config) { c.Engine, c.Concurrency = e, 1 })
	const size = 16 * mib
	data := newBuffers(t, size)
	data.fill(8)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	dead, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	dying.afterPublish = func([]int) {
		once.Do(func() {
			e.Close()
			close(dead)
			<-release // the stale entries stay until the others are done
		})
	}
	dyingErr := make(chan error, 1)
	go func() {
		b := newBuffers(t, size)
		dyingErr <- dying.GetReplica(ctx, "obj", b.addrs, b.sizes)
	}()
	<-dead
	stale := 0
	for _, sh := range seed.record(t, "obj").p.Shards {
		if slices.ContainsFunc(sh.ReplicaList, func(l location) bool { return l.SegmentName == dying.LocalServerName() }) {
			stale++
		}
	}
	if stale == 0 {
		t.Fatal("the dying receiver published nothing")
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	got := []*buffers{newBuffers(t, size), newBuffers(t, 4*mib, 12*mib)}
	for i := range got {
		n := newNode(t, etcd, nil)
		wg.Go(func() { errs[i] = n.GetReplica(ctx, "obj", got[i].addrs, got[i].sizes) })
	}
	wg.Wait()
	close(release)
	for i := range got {
		if errs[i] != nil {
			t.Fatalf("receiver %d: %v", i, errs[i])
		}
		if !got[i].equal(data) {
			t.Fatalf("receiver %d: bytes differ from the seed's", i)
		}
	}
	if err := <-dyingErr; !errors.Is(err, ErrTransferEngine) {
		t.Fatalf("dead receiver's GetReplica = %v, want ErrTransferEngine", err)
	}
	for i, sh := range seed.record(t, "obj").p.Shards {
		if slices.ContainsFunc(sh.ReplicaList, func(l location) bool { return l.SegmentName == dying.LocalServerName() }) {
			t.Errorf("shard %d: the dead receiver is still listed", i)
		}
	}
	t.Logf("%d shards listed the dead receiver", stale)
}

package p2p

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
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
// nothing is read and etcd is not asked.
func testSwarm(n int, replicas map[int][]string) *swarm {
	p := &payload{Name: "obj", Size: uint64(n), SizeList: []uint64{uint64(n)}, MaxShardSize: 1}
	for i := range n {
		sh := shard{Size: 1, Gold: []location{{"seed", uint64(i)}}}
		for _, r := range replicas[i] {
			sh.ReplicaList = append(sh.ReplicaList, location{r, uint64(i)})
		}
		p.Shards = append(p.Shards, sh)
	}
	s := &Store{cfg: Config{Concurrency: 4}, name: "me", log: quiet}
	r := &record{p: p, rev: 1, created: 1}
	w := newSwarm(s, r, newLayout([]span{{0x1000, uint64(n)}}))
	w.cl = &claims{dir: claimDir(r), me: "me"}
	return w
}

// enter applies claim directory entries to w, as the watch would.
func (w *swarm) enter(kvs ...string) {
	for i := 0; i < len(kvs); i += 2 {
		if w.applyClaimLocked(w.cl.dir+kvs[i], kvs[i+1], true) {
			w.mergeLocked()
		}
	}
}

// take picks shards now, as workers would, and starts reading each, until
// none may be picked; it returns the picks and what the last pick said.
func take(w *swarm, now time.Time) (got []pick, wait bool, stealAt time.Time) {
	for {
		pk, wait, stealAt := w.pickLocked(now)
		if pk.i < 0 {
			return got, wait, stealAt
		}
		w.state[pk.i] = busy
		if pk.how != fromPeers {
			w.seedBusy++
		} else {
			w.reading[pk.from]++
		}
		got = append(got, pk)
	}
}

func TestPick(t *testing.T) {
	t.Run("a seed read first, then peers, rarest first", func(t *testing.T) {
		w := testSwarm(6, map[int][]string{1: {"a", "b"}, 2: {"a"}, 3: {"a", "b", "c"}})
		w.enter("f/a", "", "f/b", "", "f/c", "")
		got, wait, _ := take(w, time.Now())
		// One shard nobody has, claimed for the seed; then one from each
		// holder, each holder's rarest; then the seed slot is full and the
		// rest wait for it.
		if len(got) != 4 || got[0].how != claimSeed || w.live[got[0].i] != 0 || !wait {
			t.Fatalf("picked %+v (wait %v), want a claim then three peer reads, then wait", got, wait)
		}
		byHolder := map[string]int{}
		for _, pk := range got[1:] {
			byHolder[pk.from] = pk.i
		}
		if want := map[string]int{"a": 2, "b": 1, "c": 3}; !maps.Equal(byHolder, want) {
			t.Fatalf("read %v from the holders, want %v", byHolder, want)
		}
	})
	t.Run("seed slots shared among fetchers", func(t *testing.T) {
		for _, tc := range []struct {
			fetchers []string
			seeded   bool
			want     int
		}{
			{nil, false, 1},          // until a seed read lands: one
			{nil, true, 4},           // alone: Concurrency
			{[]string{"a"}, true, 2}, // two receivers: half each
			{[]string{"a", "b", "c", "d", "e"}, true, 1}, // at least one
		} {
			w := testSwarm(16, nil)
			for _, f := range tc.fetchers {
				w.enter("f/"+f, "")
			}
			w.seeded = tc.seeded
			got, _, _ := take(w, time.Now())
			if len(got) != tc.want {
				t.Errorf("%d other fetchers (seeded %v): %d seed reads at once, want %d", len(tc.fetchers), tc.seeded, len(got), tc.want)
			}
			for _, pk := range got {
				if pk.how != claimSeed {
					t.Errorf("picked %+v, want a claim", pk)
				}
			}
		}
	})
	t.Run("no claim on what another claimed", func(t *testing.T) {
		w := testSwarm(4, nil)
		w.enter("f/a", "", "s/0", "a", "s/2", "a")
		w.seeded = true
		got, _, _ := take(w, time.Now())
		if len(got) != 2 || got[0].i == 0 || got[0].i == 2 || got[1].i == 0 || got[1].i == 2 {
			t.Fatalf("picked %+v, want shards 1 and 3 (0 and 2 are a's)", got)
		}
	})
	t.Run("others' claims stolen after patience", func(t *testing.T) {
		w := testSwarm(2, nil)
		w.enter("f/a", "", "s/0", "a", "s/1", "a")
		w.readTime, w.reads = 30*time.Millisecond, 3 // 10 ms a read
		now := time.Now()
		got, wait, stealAt := take(w, now)
		if want := w.claimedAt[0].Add(20*time.Millisecond + publishDelay); len(got) != 0 || !wait || !stealAt.Equal(want) {
			t.Fatalf("picked %+v (wait %v until %v), want to wait until %v", got, wait, stealAt, want)
		}
		// Announced meanwhile: read from the holder.
		w.enter("h/a", `{"1":1}`)
		if got, _, _ = take(w, now); len(got) != 1 || got[0] != (pick{i: 1, from: "a"}) {
			t.Fatalf("picked %+v, want shard 1 from a", got)
		}
		// The other is taken from the seed once patience has passed.
		got, _, _ = take(w, stealAt)
		if len(got) != 1 || got[0] != (pick{i: 0, how: fromSeed}) {
			t.Fatalf("picked %+v at %v, want shard 0 from the seed", got, stealAt)
		}
	})
	t.Run("a shard this node cannot serve is not claimed", func(t *testing.T) {
		w := testSwarm(2, nil)
		w.mine[0] = nil
		w.seeded = true
		got, _, _ := take(w, time.Now())
		// Alone: both from the seed, shard 0 without a claim.
		if len(got) != 2 || got[0] != (pick{i: 1, how: claimSeed}) && got[1] != (pick{i: 1, how: claimSeed}) {
			t.Fatalf("picked %+v, want shard 1 claimed", got)
		}
		w = testSwarm(2, nil)
		w.mine[0] = nil
		w.seeded = true
		w.enter("f/a", "")
		got, wait, stealAt := take(w, w.claimedAt[0])
		// With another fetcher, shard 0 is left to it for a while.
		if len(got) != 1 || got[0].i != 1 || !wait || stealAt.IsZero() {
			t.Fatalf("picked %+v (wait %v until %v), want shard 1 and to wait for 0", got, wait, stealAt)
		}
	})
}

// TestHoldsJoinTheView: shards another receiver announced are read from
// it before the record lists it, and forgotten once it leaves.
func TestHoldsJoinTheView(t *testing.T) {
	w := testSwarm(3, map[int][]string{0: {"b"}})
	w.enter("h/a/0", `{"0":100}`, "h/me/0", `{"1":0}`, "h/a/1", `{"2":102}`)
	want := [][]location{{{"b", 0}, {"a", 100}}, nil, {{"a", 102}}}
	for i, sh := range w.view.p.Shards {
		if !slices.Equal(sh.ReplicaList, want[i]) {
			t.Errorf("shard %d: replicas %v, want %v", i, sh.ReplicaList, want[i])
		}
	}
	if !slices.Equal(w.live, []int{2, 0, 1}) {
		t.Errorf("live %v, want [2 0 1]", w.live)
	}
	if len(w.rec.p.Shards[0].ReplicaList) != 1 {
		t.Errorf("the record was changed: %v", w.rec.p.Shards[0].ReplicaList)
	}
	for _, k := range []string{"h/a/0", "h/a/1"} {
		if w.applyClaimLocked(w.cl.dir+k, "", false) {
			w.mergeLocked()
		}
	}
	if !slices.Equal(w.live, []int{1, 0, 0}) {
		t.Errorf("live %v once a left, want [1 0 0]", w.live)
	}
}

// TestPublishedHoldsAreDropped: an announcement the record has caught up
// with is dropped, so the view's merge on each record change walks only
// what is announced and not yet published.
func TestPublishedHoldsAreDropped(t *testing.T) {
	w := testSwarm(3, nil)
	w.enter("h/a/0", `{"0":100,"1":101}`, "h/b/0", `{"2":202}`)
	r := &record{p: w.base.p, rev: 2, created: 1}
	p := *r.p
	p.Shards = slices.Clone(p.Shards)
	p.Shards[0].ReplicaList = []location{{"a", 100}}
	p.Shards[2].ReplicaList = []location{{"b", 202}}
	r.p = &p
	w.install(r)
	if len(w.holds) != 1 || len(w.holds[w.cl.dir+"h/a/0"].at) != 1 {
		t.Errorf("holds %v after the record listed a for shard 0 and b for 2, want a's shard 1 alone", w.holds)
	}
	if !slices.Equal(w.live, []int{1, 1, 1}) {
		t.Errorf("live %v, want [1 1 1]", w.live)
	}
}

func TestClaimKey(t *testing.T) {
	r := &record{p: &payload{Name: "a/b", Shards: []shard{{Gold: []location{{"s1", 64}}}}}, created: 7}
	dir := claimDir(r)
	if !strings.HasPrefix(dir, "mooncake/p2p-claims/7-") || !strings.HasSuffix(dir, "/a/b/") {
		t.Fatalf("dir %q", dir)
	}
	// Registered anew elsewhere: another version, another directory.
	r.p.Shards[0].Gold[0].Offset = 128
	if claimDir(r) == dir {
		t.Fatalf("the same directory %q for seeds' copies at other addresses", dir)
	}
	for _, tc := range []struct {
		key   string
		kind  byte
		seg   string
		shard int
		ok    bool
	}{
		{dir + "f/10.0.0.1:15001", fetcherKey, "10.0.0.1:15001", 0, true},
		{dir + "h/10.0.0.1:15001/3", holdsKey, "10.0.0.1:15001", 0, true},
		{dir + "h/a/b/3", holdsKey, "a/b", 0, true},
		{dir + "s/12", claimedKey, "", 12, true},
		{dir + "s/-1", 0, "", 0, false},
		{dir + "s/x", 0, "", 0, false},
		{dir + "f/", 0, "", 0, false},
		{dir + "x/y", 0, "", 0, false},
		{"mooncake/p2p-claims/7-0/a/f/x", 0, "", 0, false},
	} {
		kind, seg, shard, ok := claimKey(dir, tc.key)
		if ok != tc.ok || ok && (kind != tc.kind || seg != tc.seg || shard != tc.shard) {
			t.Errorf("claimKey(%q) = %c %q %d %v, want %c %q %d %v", tc.key, kind, seg, shard, ok, tc.kind, tc.seg, tc.shard, tc.ok)
		}
	}
}

// TestSeedSendsEachShardOnceFirst: eight receivers fetch a 32-shard object
// together from one seed. No shard is read from the seed a second time
// before every shard was read from it once, or claimed for that first
// read: a claim comes a round trip to etcd before its read, and others act
// on it as soon as they see it.
func TestSeedSendsEachShardOnceFirst(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	const n, shard = 32, 256 << 10
	data := newBuffers(t, n*shard)
	data.fill(11)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, shard, "", false); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	// Shards in the order their seed reads started, or were about to be
	// claimed (negative: -1-i).
	var order []int
	const receivers = 8
	nodes := make([]*node, receivers)
	got := make([]*buffers, receivers)
	for i := range nodes {
		nodes[i] = newNode(t, etcd, nil)
		nodes[i].onSeedRead = func(i int) {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}
		nodes[i].beforeClaim = func(i int) {
			mu.Lock()
			order = append(order, -1-i)
			mu.Unlock()
		}
		got[i] = newBuffers(t, n*shard)
	}
	errs := make([]error, receivers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range nodes {
		wg.Go(func() {
			<-start
			errs[i] = r.GetReplica(ctx, "obj", got[i].addrs, got[i].sizes)
		})
	}
	close(start)
	wg.Wait()
	for i := range nodes {
		if errs[i] != nil {
			t.Fatalf("receiver %d: %v", i, errs[i])
		}
		if !got[i].equal(data) {
			t.Fatalf("receiver %d: bytes differ from the seed's", i)
		}
	}
	started := map[int]bool{} // read from the seed, or about to be claimed for it
	read := map[int]bool{}
	reads := 0
	for k, i := range order {
		if i < 0 {
			started[-1-i] = true
			continue
		}
		if read[i] && len(started) < n {
			t.Fatalf("shard %d read from the seed again (event %d) when %d of %d shards had been read or claimed once; order %v",
				i, k, len(started), n, order)
		}
		read[i], started[i] = true, true
		reads++
	}
	t.Logf("%d seed reads for %d shards; reads and claims (-1-shard): %v", reads, n, order)
	if len(read) != n {
		t.Fatalf("%d shards read from the seed, want %d", len(read), n)
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

// TestStuckClaimant: a receiver claims a shard for a seed read and never
// finishes it (its read hangs; it stays alive, its claim with it). The
// others take that shard from the seed once they have nothing else to do,
// and get every byte.
func TestStuckClaimant(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	const size = 8 * mib
	data := newBuffers(t, size)
	data.fill(12)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	stuck, release := make(chan int, 1), make(chan struct{})
	slow := newNode(t, etcd, func(c *Config) { c.Concurrency = 1 })
	slow.onSeedRead = func(i int) {
		select {
		case stuck <- i:
			<-release // the first seed read hangs until the test ends
		default:
		}
	}
	slowErr := make(chan error, 1)
	go func() {
		b := newBuffers(t, size)
		slowErr <- slow.GetReplica(ctx, "obj", b.addrs, b.sizes)
	}()
	i := <-stuck
	var wg sync.WaitGroup
	errs := make([]error, 2)
	got := []*buffers{newBuffers(t, size), newBuffers(t, size)}
	for k := range got {
		n := newNode(t, etcd, nil)
		wg.Go(func() { errs[k] = n.GetReplica(ctx, "obj", got[k].addrs, got[k].sizes) })
	}
	wg.Wait()
	close(release)
	for k := range got {
		if errs[k] != nil {
			t.Fatalf("receiver %d (shard %d claimed by a stuck one): %v", k, i, errs[k])
		}
		if !got[k].equal(data) {
			t.Fatalf("receiver %d: bytes differ from the seed's", k)
		}
	}
	if err := <-slowErr; err != nil {
		t.Fatalf("the stuck receiver, released: %v", err)
	}
}

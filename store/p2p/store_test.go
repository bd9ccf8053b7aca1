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

const mib = 1 << 20

func TestRoundTrip(t *testing.T) {
	etcd := startEtcd(t)
	cases := []struct {
		name      string
		seed      []uint64 // the seed's buffers
		recv      []uint64 // each receiver's buffers, same total
		maxShard  uint64
		chunk     uint64 // registration chunk, zero: 4 GiB
		transport string // zero: tcp
	}{
		// The plainest object: one buffer, one default-sized shard.
		{name: "one shard", seed: []uint64{mib}, recv: []uint64{mib}},
		// A tail shard shorter than the others.
		{name: "tail shard", seed: []uint64{10*mib + 123}, recv: []uint64{10*mib + 123}, maxShard: mib},
		// Shards cross the receiver's buffers: several READs per shard,
		// and the receiver serves only the shards it holds whole.
		{name: "uneven splits", seed: []uint64{3 * mib, 5*mib + 7, mib - 7}, recv: []uint64{mib, 6 * mib, 2 * mib}, maxShard: 2 * mib},
		// Many small seed buffers into one receiver buffer.
		{name: "small buffers", seed: slices.Repeat([]uint64{64<<10 + 1}, 7), recv: []uint64{7 * (64<<10 + 1)}, maxShard: 100 << 10},
		// Registration chunks cut shards (seed) and pieces (receiver).
		{name: "chunks", seed: []uint64{8 * mib}, recv: []uint64{8 * mib}, maxShard: 2 * mib, chunk: 3*mib + 4096},
		// The same-host path the engine picks by default.
		{name: "shared memory", seed: []uint64{2 * mib, mib}, recv: []uint64{mib, 2 * mib}, maxShard: mib, transport: "auto"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			edit := func(c *Config) {
				if tc.transport != "" {
					c.EngineConfig.Transport = tc.transport
				}
			}
			nodes := []*node{newNode(t, etcd, edit), newNode(t, etcd, edit), newNode(t, etcd, edit)}
			if tc.chunk != 0 {
				for _, n := range nodes {
					n.mem.chunk = tc.chunk
				}
			}
			seed := newBuffers(t, tc.seed...)
			seed.fill(1)
			name := "roundtrip/" + tc.name
			if err := nodes[0].Register(ctx, name, seed.addrs, seed.sizes, tc.maxShard, "", false); err != nil {
				t.Fatalf("Register: %v", err)
			}
			infos, err := nodes[1].List(ctx, "roundtrip/"+tc.name)
			if err != nil {
				t.Fatal(err)
			}
			maxShard := cmpOr(tc.maxShard, DefaultMaxShardSize)
			var total uint64
			for _, n := range tc.seed {
				total += n
			}
			want := []PayloadInfo{{Name: name, MaxShardSize: maxShard, TotalSize: total, SizeList: tc.seed}}
			if !slices.EqualFunc(infos, want, infoEqual) {
				t.Fatalf("List = %+v, want %+v", infos, want)
			}
			r := nodes[0].record(t, name)
			checkShards(t, r.p, tc.seed, cmpOr(tc.chunk, maxChunk))

			// Two receivers in turn: the second reads from the first
			// wherever the first became a source.
			for i, n := range nodes[1:] {
				got := newBuffers(t, tc.recv...)
				if err := n.GetReplica(ctx, name, got.addrs, got.sizes); err != nil {
					t.Fatalf("receiver %d: GetReplica: %v", i+1, err)
				}
				if !got.equal(seed) {
					t.Fatalf("receiver %d: bytes differ from the seed's", i+1)
				}
				r := n.record(t, name)
				holds := wholeShards(r.p, tc.recv, cmpOr(tc.chunk, maxChunk))
				for s, sh := range r.p.Shards {
					has := slices.ContainsFunc(sh.ReplicaList, func(l location) bool { return l.SegmentName == n.LocalServerName() })
					if has != holds[s] {
						t.Errorf("receiver %d: shard %d: listed as replica %v, holds it whole %v", i+1, s, has, holds[s])
					}
				}
			}
		})
	}
}

func cmpOr(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}

func infoEqual(a, b PayloadInfo) bool {
	return a.Name == b.Name && a.MaxShardSize == b.MaxShardSize && a.TotalSize == b.TotalSize && slices.Equal(a.SizeList, b.SizeList)
}

// checkShards checks the seed's shards: no larger than max_shard_size,
// never across a buffer or a registration chunk, tiling the object.
func checkShards(t *testing.T, p *payload, seed []uint64, chunk uint64) {
	t.Helper()
	var want []uint64
	for _, n := range seed {
		for c := uint64(0); c < n; c += chunk {
			cn := min(chunk, n-c)
			for off := uint64(0); off < cn; off += p.MaxShardSize {
				want = append(want, min(p.MaxShardSize, cn-off))
			}
		}
	}
	var got []uint64
	for _, sh := range p.Shards {
		got = append(got, sh.Size)
		if len(sh.Gold) != 1 || len(sh.ReplicaList) != 0 {
			t.Errorf("fresh shard: gold %v, replicas %v", sh.Gold, sh.ReplicaList)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("shard sizes %v, want %v", got, want)
	}
}

// wholeShards says, per shard of p, whether it lies inside one registered
// chunk of buffers sized recv.
func wholeShards(p *payload, recv []uint64, chunk uint64) []bool {
	var bounds []uint64 // chunk ends, in object offsets
	var at uint64
	for _, n := range recv {
		for c := uint64(0); c < n; c += chunk {
			at += min(chunk, n-c)
			bounds = append(bounds, at)
		}
	}
	whole := make([]bool, len(p.Shards))
	at = 0
	for i, sh := range p.Shards {
		whole[i] = !slices.ContainsFunc(bounds, func(b uint64) bool { return b > at && b < at+sh.Size })
		at += sh.Size
	}
	return whole
}

func TestRegisterExisting(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	a, b, recv := newNode(t, etcd, nil), newNode(t, etcd, nil), newNode(t, etcd, nil)
	bufA, bufB := newBuffers(t, 2*mib), newBuffers(t, 2*mib)
	bufA.fill(1)
	bufB.fill(2)
	if err := a.Register(ctx, "obj", bufA.addrs, bufA.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	// Another seed may not take the name over without forceCreate, and
	// its failed attempt leaves nothing registered.
	if err := b.Register(ctx, "obj", bufB.addrs, bufB.sizes, mib, "", false); !errors.Is(err, ErrPayloadOpened) {
		t.Fatalf("second Register = %v, want ErrPayloadOpened", err)
	}
	if len(b.mem.refs) != 0 || len(b.catalog) != 0 {
		t.Fatalf("failed Register left %d chunks, %d entries", len(b.mem.refs), len(b.catalog))
	}
	// Nor may the same seed register it twice.
	if err := a.Register(ctx, "obj", bufA.addrs, bufA.sizes, mib, "", true); !errors.Is(err, ErrPayloadOpened) {
		t.Fatalf("Register again on the same node = %v, want ErrPayloadOpened", err)
	}
	// Someone fetches a's object and becomes a replica of it.
	got := newBuffers(t, 2*mib)
	if err := recv.GetReplica(ctx, "obj", got.addrs, got.sizes); err != nil || !got.equal(bufA) {
		t.Fatalf("GetReplica: %v, equal %v", err, got.equal(bufA))
	}
	if err := recv.DeleteReplica(ctx, "obj"); err != nil {
		t.Fatal(err)
	}
	// forceCreate replaces the object: b is its only seed now.
	if err := b.Register(ctx, "obj", bufB.addrs, bufB.sizes, mib, "", true); err != nil {
		t.Fatalf("Register with forceCreate: %v", err)
	}
	for i, sh := range b.record(t, "obj").p.Shards {
		if len(sh.Gold) != 1 || sh.Gold[0].SegmentName != b.LocalServerName() || len(sh.ReplicaList) != 0 {
			t.Errorf("shard %d after forceCreate: gold %v, replicas %v", i, sh.Gold, sh.ReplicaList)
		}
	}
	got2 := newBuffers(t, mib, mib)
	if err := recv.GetReplica(ctx, "obj", got2.addrs, got2.sizes); err != nil || !got2.equal(bufB) {
		t.Fatalf("GetReplica after forceCreate: %v, equal %v", err, got2.equal(bufB))
	}
}

func TestUnregister(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed, r1, r2, other := newNode(t, etcd, nil), newNode(t, etcd, nil), newNode(t, etcd, nil), newNode(t, etcd, nil)
	data := newBuffers(t, 3*mib)
	data.fill(3)

	// Unregistering an object nobody fetched deletes it.
	if err := seed.Register(ctx, "lonely", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	if err := seed.Unregister(ctx, "lonely"); err != nil {
		t.Fatal(err)
	}
	if r := seed.record(t, "lonely"); r != nil {
		t.Fatalf("unregistered object still published: %+v", r.p)
	}
	if len(seed.mem.refs) != 0 {
		t.Fatalf("Unregister left %d chunks registered", len(seed.mem.refs))
	}
	if err := seed.Unregister(ctx, "lonely"); !errors.Is(err, ErrPayloadNotOpened) {
		t.Fatalf("Unregister twice = %v, want ErrPayloadNotOpened", err)
	}

	// With a replica, the object outlives its seed.
	if err := seed.Register(ctx, "shared", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	b1 := newBuffers(t, 3*mib)
	if err := r1.GetReplica(ctx, "shared", b1.addrs, b1.sizes); err != nil {
		t.Fatal(err)
	}
	if err := seed.DeleteReplica(ctx, "shared"); !errors.Is(err, ErrPayloadNotOpened) {
		t.Fatalf("DeleteReplica on the seed = %v, want ErrPayloadNotOpened", err)
	}
	if err := r1.Unregister(ctx, "shared"); !errors.Is(err, ErrPayloadNotOpened) {
		t.Fatalf("Unregister on a replica = %v, want ErrPayloadNotOpened", err)
	}
	if err := seed.Unregister(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	for i, sh := range seed.record(t, "shared").p.Shards {
		if len(sh.Gold) != 0 || len(sh.ReplicaList) != 1 {
			t.Fatalf("shard %d after Unregister: gold %v, replicas %v", i, sh.Gold, sh.ReplicaList)
		}
	}
	// The seed's memory is gone from its engine; r2 reads from r1 only.
	b2 := newBuffers(t, mib, 2*mib)
	if err := r2.GetReplica(ctx, "shared", b2.addrs, b2.sizes); err != nil || !b2.equal(data) {
		t.Fatalf("GetReplica from the replica: %v, equal %v", err, b2.equal(data))
	}
	infos, err := other.List(ctx, "")
	if err != nil || len(infos) != 1 || infos[0].Name != "shared" {
		t.Fatalf("List = %+v, %v", infos, err)
	}

	// DeleteReplica by both: then nobody serves it and it is deleted.
	if err := r1.DeleteReplica(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	for i, sh := range other.record(t, "shared").p.Shards {
		if len(sh.ReplicaList) != 1 || sh.ReplicaList[0].SegmentName != r2.LocalServerName() {
			t.Fatalf("shard %d after r1's DeleteReplica: replicas %v", i, sh.ReplicaList)
		}
	}
	if err := r2.DeleteReplica(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if err := r2.DeleteReplica(ctx, "shared"); !errors.Is(err, ErrPayloadNotOpened) {
		t.Fatalf("DeleteReplica twice = %v, want ErrPayloadNotOpened", err)
	}
	if infos, err := other.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("List after every node withdrew = %+v, %v", infos, err)
	}
	b3 := newBuffers(t, 3*mib)
	if err := other.GetReplica(ctx, "shared", b3.addrs, b3.sizes); !errors.Is(err, ErrPayloadNotFound) {
		t.Fatalf("GetReplica of a deleted object = %v, want ErrPayloadNotFound", err)
	}
}

func TestErrors(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed, recv := newNode(t, etcd, nil), newNode(t, etcd, nil)
	data := newBuffers(t, 2*mib, mib)
	data.fill(4)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	buf := newBuffers(t, 3*mib, mib)
	closed := newNode(t, etcd, nil)
	closed.Close()
	cases := []struct {
		name string
		call func() error
		want error
	}{
		// Fetching what was never published.
		{"missing payload", func() error { return recv.GetReplica(ctx, "nope", buf.addrs[:1], buf.sizes[:1]) }, ErrPayloadNotFound},
		// Buffers one MiB too large for the object.
		{"size mismatch", func() error { return recv.GetReplica(ctx, "obj", buf.addrs, buf.sizes) }, ErrInvalidArgument},
		// Address and size lists of different lengths.
		{"uneven lists", func() error { return recv.GetReplica(ctx, "obj", buf.addrs, buf.sizes[:1]) }, ErrInvalidArgument},
		// No buffers at all.
		{"no buffers", func() error { return seed.Register(ctx, "empty", nil, nil, 0, "", false) }, ErrInvalidArgument},
		// A zero-length buffer.
		{"zero size", func() error { return seed.Register(ctx, "z", buf.addrs[:1], []uint64{0}, 0, "", false) }, ErrInvalidArgument},
		// A null address.
		{"null address", func() error { return seed.Register(ctx, "z", []uintptr{0}, []uint64{1}, 0, "", false) }, ErrInvalidArgument},
		// An empty name.
		{"empty name", func() error { return recv.GetReplica(ctx, "", buf.addrs[:1], []uint64{3 * mib}) }, ErrInvalidArgument},
		// The same memory twice in one object.
		{"overlap in one call", func() error {
			return seed.Register(ctx, "twice", []uintptr{buf.addrs[0], buf.addrs[0] + mib}, []uint64{2 * mib, mib}, 0, "", false)
		}, ErrAddressOverlapped},
		// Memory that overlaps a registered buffer without being it.
		{"overlap with registered", func() error {
			return seed.Register(ctx, "part", []uintptr{data.addrs[0] + 4096}, []uint64{mib}, 0, "", false)
		}, ErrAddressOverlapped},
		// Fetching an object this node is the seed of.
		{"fetch own object", func() error { return seed.GetReplica(ctx, "obj", buf.addrs[:1], buf.sizes[:1]) }, ErrPayloadOpened},
		// Withdrawing what this node never opened.
		{"unregister unknown", func() error { return recv.Unregister(ctx, "obj") }, ErrPayloadNotOpened},
		{"delete unknown replica", func() error { return recv.DeleteReplica(ctx, "obj") }, ErrPayloadNotOpened},
		// Calls after Close.
		{"closed", func() error { _, err := closed.List(ctx, ""); return err }, ErrClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// None of the failures left memory registered or names reserved.
	if len(recv.mem.refs) != 0 || len(recv.catalog) != 0 {
		t.Errorf("receiver holds %d chunks, %d entries", len(recv.mem.refs), len(recv.catalog))
	}
	if len(seed.catalog) != 1 || len(seed.mem.refs) != 2 {
		t.Errorf("seed holds %d entries, %d chunks; want 1 and 2", len(seed.catalog), len(seed.mem.refs))
	}
}

func TestSharedBuffers(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed, recv := newNode(t, etcd, nil), newNode(t, etcd, nil)
	data := newBuffers(t, 2*mib)
	data.fill(5)
	// One buffer backs two objects: registered once, counted twice.
	for _, name := range []string{"a", "b"} {
		if err := seed.Register(ctx, name, data.addrs, data.sizes, mib, "", false); err != nil {
			t.Fatalf("Register %s: %v", name, err)
		}
	}
	if c := seed.mem.refs[span{uint64(data.addrs[0]), 2 * mib}]; c == nil || c.n != 2 || !c.owned {
		t.Fatalf("chunk ref = %+v, want 2 references, owned", c)
	}
	if err := seed.Unregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	got := newBuffers(t, 2*mib)
	if err := recv.GetReplica(ctx, "b", got.addrs, got.sizes); err != nil || !got.equal(data) {
		t.Fatalf("GetReplica b after a went: %v, equal %v", err, got.equal(data))
	}

	// Memory the engine allocated is used as it is and stays the
	// engine's: Unregister leaves it registered, Free still works.
	ab, err := seed.Engine().AllocateBuffer(context.Background(), mib, "cpu:0")
	if err != nil {
		t.Fatal(err)
	}
	copy(ab.Bytes(), data.bufs[0])
	if err := seed.Register(ctx, "alloc", []uintptr{ab.Addr()}, []uint64{mib}, 0, "", false); err != nil {
		t.Fatal(err)
	}
	got2 := newBuffers(t, mib)
	if err := recv.GetReplica(ctx, "alloc", got2.addrs, got2.sizes); err != nil || !slices.Equal(got2.bufs[0], ab.Bytes()) {
		t.Fatalf("GetReplica of an engine buffer: %v", err)
	}
	if err := seed.Unregister(ctx, "alloc"); err != nil {
		t.Fatal(err)
	}
	if err := ab.Free(); err != nil {
		t.Fatalf("Free after Unregister: %v", err)
	}
}

// TestSourceDiesMidway kills the replica a receiver reads from after its
// first shard: the remaining shards come from the seed.
func TestSourceDiesMidway(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed, r1 := newNode(t, etcd, nil), newNode(t, etcd, nil)
	// One shard at a time, so the source dies between two of them.
	r2 := newNode(t, etcd, func(c *Config) { c.Concurrency = 1 })
	const shards = 8
	data := newBuffers(t, shards*mib)
	data.fill(6)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	b1 := newBuffers(t, shards*mib)
	if err := r1.GetReplica(ctx, "obj", b1.addrs, b1.sizes); err != nil {
		t.Fatal(err)
	}
	var first sync.Once
	r2.afterShard = func(int) {
		first.Do(func() {
			if err := r1.Close(); err != nil {
				t.Errorf("r1 Close: %v", err)
			}
		})
	}
	b2 := newBuffers(t, shards*mib)
	if err := r2.GetReplica(ctx, "obj", b2.addrs, b2.sizes); err != nil {
		t.Fatalf("GetReplica with a dying source: %v", err)
	}
	if !b2.equal(data) {
		t.Fatal("bytes differ from the seed's")
	}
	// r1 withdrew on Close; r2 is listed for every shard.
	for i, sh := range seed.record(t, "obj").p.Shards {
		if len(sh.ReplicaList) != 1 || sh.ReplicaList[0].SegmentName != r2.LocalServerName() {
			t.Errorf("shard %d: replicas %v, want only r2", i, sh.ReplicaList)
		}
	}
	// The first shard came from the replica (preferred over the seed),
	// the other seven from the seed: r2 learns that r1 is gone from the
	// record, or from one failed read. A server counts what it sent after
	// sending it: the counts are final once its engine has closed.
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	if got := r1.served(t); got != mib {
		t.Errorf("r1 served %d bytes before dying, want %d", got, mib)
	}
	if got, want := seed.served(t), uint64(shards*mib+(shards-1)*mib); got != want {
		t.Errorf("seed served %d bytes, want %d", got, want)
	}
}

// TestAllSourcesDead: a seed whose engine vanished without withdrawing
// (a crash) leaves stale metadata; a receiver gives up after its retries
// and can try again later.
func TestAllSourcesDead(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Transport: "tcp", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	seed := newNode(t, etcd, func(c *Config) { c.Engine = e })
	recv := newNode(t, etcd, func(c *Config) { c.Retries = 2 })
	data := newBuffers(t, 2*mib)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	e.Close()
	got := newBuffers(t, 2*mib)
	err = recv.GetReplica(ctx, "obj", got.addrs, got.sizes)
	if !errors.Is(err, ErrTooManyRetries) || !errors.Is(err, ErrTransferEngine) {
		t.Fatalf("GetReplica from a dead seed = %v, want ErrTooManyRetries wrapping ErrTransferEngine", err)
	}
	if len(recv.mem.refs) != 0 || len(recv.catalog) != 0 {
		t.Fatalf("failed GetReplica left %d chunks, %d entries", len(recv.mem.refs), len(recv.catalog))
	}
}

func TestCloseWithdraws(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed, recv, other := newNode(t, etcd, nil), newNode(t, etcd, nil), newNode(t, etcd, nil)
	data := newBuffers(t, mib, mib)
	for i, name := range []string{"x", "y"} {
		if err := seed.Register(ctx, name, data.addrs[i:i+1], data.sizes[i:i+1], 0, "", false); err != nil {
			t.Fatal(err)
		}
	}
	got := newBuffers(t, mib)
	if err := recv.GetReplica(ctx, "x", got.addrs, got.sizes); err != nil {
		t.Fatal(err)
	}
	if err := recv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := recv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if sh := other.record(t, "x").p.Shards[0]; len(sh.ReplicaList) != 0 || len(sh.Gold) != 1 {
		t.Fatalf("after the receiver closed: gold %v, replicas %v", sh.Gold, sh.ReplicaList)
	}
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	if infos, err := other.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("List after every node closed = %+v, %v", infos, err)
	}
}

// TestCloseCancels: Close stops a fetch in progress and waits for it; the
// shards the receiver had published already are withdrawn.
func TestCloseCancels(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	recv := newNode(t, etcd, func(c *Config) { c.Concurrency = 1 })
	data := newBuffers(t, 4*mib)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, mib, "", false); err != nil {
		t.Fatal(err)
	}
	// The receiver's only worker holds after its first shard until that
	// shard is published and Close has begun, so the fetch cannot finish
	// before Close however the two goroutines are scheduled.
	closed := make(chan error, 1)
	published := make(chan struct{})
	var firstPublish, firstShard sync.Once
	recv.afterPublish = func([]int) { firstPublish.Do(func() { close(published) }) }
	recv.afterShard = func(int) {
		firstShard.Do(func() {
			select {
			case <-published:
			case <-time.After(10 * time.Second):
				t.Error("first shard not published within 10 s")
			}
			go func() { closed <- recv.Close() }()
			<-recv.ctx.Done() // Close has begun
			if _, err := recv.List(context.Background(), ""); !errors.Is(err, ErrClosed) {
				t.Errorf("List while closing = %v, want ErrClosed", err)
			}
		})
	}
	got := newBuffers(t, 4*mib)
	if err := recv.GetReplica(ctx, "obj", got.addrs, got.sizes); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetReplica during Close = %v, want context.Canceled", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, sh := range seed.record(t, "obj").p.Shards {
		if len(sh.ReplicaList) != 0 {
			t.Errorf("shard %d: cancelled receiver listed as replica: %v", i, sh.ReplicaList)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Metadata: "127.0.0.1:2379"}, true},
		{"etcd URL list", Config{Metadata: "etcd://h1:2379;h2:2379"}, true},
		{"given engine, its name", Config{Metadata: "h:1", Engine: e, LocalServerName: e.Name()}, true},
		// Metadata is required.
		{"no metadata", Config{}, false},
		{"only separators", Config{Metadata: "etcd://;"}, false},
		{"negative retries", Config{Metadata: "h:1", Retries: -1}, false},
		{"negative timeout", Config{Metadata: "h:1", Timeout: -1}, false},
		{"huge concurrency", Config{Metadata: "h:1", Concurrency: 1 << 20}, false},
		// A name the engine does not answer to.
		{"engine name mismatch", Config{Metadata: "h:1", Engine: e, LocalServerName: "elsewhere:1"}, false},
		// The engine config is checked when the Store starts the engine.
		{"bad engine config", Config{Metadata: "h:1", EngineConfig: engine.Config{Transport: "carrier pigeon"}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("Validate = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestNewUnreachable(t *testing.T) {
	ctx := testCtx(t)
	// A port nothing listens on: New fails, and leaves no engine behind
	// (goleak checks).
	_, err := New(ctx, Config{Metadata: "127.0.0.1:1", Timeout: 500 * time.Millisecond, Logger: quiet, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	if !errors.Is(err, ErrMetadata) {
		t.Fatalf("New = %v, want ErrMetadata", err)
	}
}

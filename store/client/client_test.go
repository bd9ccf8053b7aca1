package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// startMaster runs a real master on loopback for the test.
func startMaster(t testing.TB, cfg master.ServiceConfig) *master.Server {
	t.Helper()
	s, err := master.Start(master.ServerConfig{Service: cfg, Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newClient starts a client of m with a segment of seg bytes (NoSegment for
// none) and a small staging buffer.
func newClient(t testing.TB, addr string, seg int64, opts ...func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		Master: addr, SegmentSize: seg, LocalBufferSize: 8 << 20,
		EngineConfig: engine.Config{Host: "127.0.0.1"},
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func value(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0xabcdef))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func codeOf(err error) storepb.Code {
	var e *storepb.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return storepb.OK
}

func TestPutGetSizesAndPaths(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 64<<20)
	b := newClient(t, m.Addr(), 64<<20)
	pure := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.EngineConfig.Transport = "tcp" })
	ctx := ctxT(t)

	sizes := []int{1, 63, 4096, 1<<20 + 3, 5 << 20 /* more than a staging piece */, 20<<20 + 1}
	for _, n := range sizes {
		for _, replicas := range []int{1, 2} {
			key := fmt.Sprintf("k-%d-%d", n, replicas)
			want := value(uint64(n*10+replicas), n)
			require.NoError(t, a.Put(ctx, key, want, &ReplicateConfig{Replicas: replicas}), key)
			// Every reader: the writer (its own segment may hold a replica:
			// plain copy), the other node (same host), and a pure client
			// over TCP only.
			for name, c := range map[string]*Client{"writer": a, "peer": b, "tcp": pure} {
				got, err := c.Get(ctx, key)
				require.NoError(t, err, "%s reads %s", name, key)
				require.True(t, bytes.Equal(want, got), "%s reads %s: bytes differ", name, key)
				sz, err := c.Size(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, uint64(n), sz)
			}
		}
	}
}

func TestReplicasOnDistinctSegments(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "two", value(1, 1000), &ReplicateConfig{Replicas: 2}))
	reps, _, _, _, err := m.Service().GetReplicaList("two")
	require.NoError(t, err)
	require.Len(t, reps, 2)
	names := []string{reps[0].GetMemory().SegmentName, reps[1].GetMemory().SegmentName}
	assert.ElementsMatch(t, []string{a.SegmentName(), b.SegmentName()}, names)

	// Asking for more replicas than segments places as many as there are.
	require.NoError(t, a.Put(ctx, "three", value(2, 1000), &ReplicateConfig{Replicas: 3}))
	reps, _, _, _, err = m.Service().GetReplicaList("three")
	require.NoError(t, err)
	assert.Len(t, reps, 2)

	// Preferred segment.
	require.NoError(t, a.Put(ctx, "pref", value(3, 1000), &ReplicateConfig{PreferredSegments: []string{b.SegmentName()}}))
	reps, _, _, _, err = m.Service().GetReplicaList("pref")
	require.NoError(t, err)
	require.Len(t, reps, 1)
	assert.Equal(t, b.SegmentName(), reps[0].GetMemory().SegmentName)
}

func TestWriteOnceAndUpsert(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	v1, v2 := value(1, 5000), value(2, 7000)
	require.NoError(t, a.Put(ctx, "k", v1, nil))
	// A second put succeeds without overwriting, as Mooncake's.
	require.NoError(t, a.Put(ctx, "k", v2, nil))
	got, err := a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v1, got)
	require.NoError(t, a.Upsert(ctx, "k", v2, nil))
	got, err = a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v2, got)
	// Upsert of a new key is a put.
	require.NoError(t, a.Upsert(ctx, "new", v1, nil))
	got, err = a.Get(ctx, "new")
	require.NoError(t, err)
	assert.Equal(t, v1, got)
}

func TestBadInput(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "have", value(1, 100), nil))
	longKey := string(bytes.Repeat([]byte("k"), master.MaxKeyLen+1))
	unregistered := make([]byte, 10)
	cases := []struct {
		name string
		err  error
		want storepb.Code
	}{
		// Empty keys and values are refused before the master is asked.
		{"empty key", a.Put(ctx, "", []byte("x"), nil), storepb.InvalidParams},
		{"empty value", a.Put(ctx, "k", nil, nil), storepb.InvalidParams},
		// The master refuses keys longer than MaxKeyLen.
		{"long key", a.Put(ctx, longKey, []byte("x"), nil), storepb.InvalidParams},
		// Bigger than any segment: no space, and nothing evicted in vain.
		{"oversized", a.Put(ctx, "big", make([]byte, 5<<20), nil), storepb.NoAvailableHandle},
		{"negative replicas", a.Put(ctx, "k", []byte("x"), &ReplicateConfig{Replicas: -1}), storepb.InvalidParams},
		{"PutFrom of unregistered memory", a.PutFrom(ctx, "k", unregistered, nil), storepb.InvalidParams},
		{"missing key", func() error { _, err := a.Get(ctx, "nope"); return err }(), storepb.ObjectNotFound},
		{"get empty key", func() error { _, err := a.Get(ctx, ""); return err }(), storepb.InvalidParams},
		// A buffer smaller than the value.
		{"short buffer", func() error { _, err := a.GetInto(ctx, "have", make([]byte, 99)); return err }(), storepb.InvalidParams},
		{"remove missing", a.Remove(ctx, "nope", false), storepb.ObjectNotFound},
		{"unregister unknown", a.UnregisterBuffer(unregistered), storepb.InvalidParams},
		{"register empty", a.RegisterBuffer(nil), storepb.InvalidParams},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Error(t, c.err)
			assert.Equal(t, c.want, codeOf(c.err), "%v", c.err)
		})
	}
	// Nothing above damaged the stored object.
	got, err := a.Get(ctx, "have")
	require.NoError(t, err)
	assert.Equal(t, value(1, 100), got)
	// Mismatched batch arguments.
	errs := a.BatchPut(ctx, []string{"a", "b"}, [][]byte{{1}}, nil)
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
	_, errs = a.BatchGetInto(ctx, []string{"a"}, nil)
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
}

func TestRegisteredBuffers(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	src, dst := make([]byte, 3<<20), make([]byte, 3<<20)
	copy(src, value(9, len(src)))
	require.NoError(t, b.RegisterBuffer(src))
	require.NoError(t, b.RegisterBuffer(dst))
	require.NoError(t, b.PutFrom(ctx, "zc", src, nil))
	n, err := b.GetInto(ctx, "zc", dst)
	require.NoError(t, err)
	require.Equal(t, len(src), n)
	assert.True(t, bytes.Equal(src, dst))
	got, err := a.Get(ctx, "zc")
	require.NoError(t, err)
	assert.True(t, bytes.Equal(src, got))
	require.NoError(t, b.UnregisterBuffer(src))
	assert.Equal(t, storepb.InvalidParams, codeOf(b.PutFrom(ctx, "zc2", src, nil)))
}

// A registered Go buffer whose last outside reference is dropped stays
// allocated while registered: the collector must not hand its memory to a
// new buffer the engine would then see as an overlapping registration (or
// worse, write into).
func TestRegisteredBufferOutlivesCallerReference(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), NoSegment)
	const size = 1 << 20
	for range 4 {
		require.NoError(t, a.RegisterBuffer(make([]byte, size)))
	}
	for range 3 {
		runtime.GC()
	}
	for i := range 16 {
		require.NoError(t, a.RegisterBuffer(make([]byte, size)), "buffer %d", i)
		runtime.GC()
	}
}

func TestBatch(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 32<<20)
	b := newClient(t, m.Addr(), 32<<20)
	ctx := ctxT(t)
	const n = 300
	keys := make([]string, n)
	vals := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("b%03d", i)
		vals[i] = value(uint64(i), 4096+i)
	}
	// More bytes than the staging buffer's quarter: the batch goes in waves.
	keys[7], vals[7] = "big", value(77, 6<<20)
	for i, err := range a.BatchPut(ctx, keys, vals, &ReplicateConfig{Replicas: 2}) {
		require.NoError(t, err, keys[i])
	}
	ask := append([]string{"missing", ""}, keys...)
	got, errs := b.BatchGet(ctx, ask)
	assert.Equal(t, storepb.ObjectNotFound, codeOf(errs[0]))
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[1]))
	for i := range keys {
		require.NoError(t, errs[i+2], keys[i])
		require.True(t, bytes.Equal(vals[i], got[i+2]), keys[i])
	}
	ok, errs := b.BatchExist(ctx, []string{"b001", "missing"})
	assert.Equal(t, []bool{true, false}, ok)
	assert.Equal(t, []error{nil, nil}, errs)
	dsts := [][]byte{make([]byte, 4096), make([]byte, 10)}
	ns, errs := b.BatchGetInto(ctx, []string{"b000", "b001"}, dsts)
	require.NoError(t, errs[0])
	assert.Equal(t, 4096, ns[0])
	assert.Equal(t, vals[0], dsts[0])
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[1]))

	for _, err := range b.BatchRemove(ctx, []string{"b000", "missing"}, true) {
		_ = err
	}
	ok, _ = b.BatchExist(ctx, []string{"b000"})
	assert.False(t, ok[0])
	removed, err := b.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, n-1, removed)
}

// RemoveByRegex removes what the pattern matches and nothing else, and a
// reader's cached replica lists do not outlive the removal.
func TestRemoveByRegex(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	keys := []string{"req7/blk0", "req7/blk1", "req70/blk0", "req8/blk0"}
	for i, k := range keys {
		require.NoError(t, a.Put(ctx, k, value(uint64(i), 1000), nil))
	}
	// Reads lease the objects and fill the lease cache.
	for _, k := range keys {
		_, err := a.Get(ctx, k)
		require.NoError(t, err)
	}
	n, err := a.RemoveByRegex(ctx, "^req7/", false)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "leased objects removed without force")
	n, err = a.RemoveByRegex(ctx, "^req7/", true)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for i, k := range keys {
		got, err := a.Get(ctx, k)
		if i < 2 {
			assert.Equal(t, storepb.ObjectNotFound, codeOf(err), k)
			continue
		}
		require.NoError(t, err, k)
		assert.Equal(t, value(uint64(i), 1000), got, k)
	}
	_, err = a.RemoveByRegex(ctx, "req[", true)
	assert.Equal(t, storepb.InvalidParams, codeOf(err))
}

func TestChecksumCatchesCorruption(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	// Larger than a slice: the engine checksums slices as they land and
	// the client combines them.
	want := value(5, 600<<10)
	require.NoError(t, a.Put(ctx, "one", want, &ReplicateConfig{PreferredSegments: []string{a.SegmentName()}}))
	require.NoError(t, a.Put(ctx, "two", want, &ReplicateConfig{Replicas: 2}))
	// Flip a byte of every replica that lives in a's segment.
	corrupt := func(key string) {
		reps, _, _, _, err := m.Service().GetReplicaList(key)
		require.NoError(t, err)
		for _, r := range reps {
			if mr := r.GetMemory(); mr.SegmentName == a.SegmentName() {
				off := mr.BufferAddress - uint64(a.segBuf.Addr()) + 100
				a.segBuf.Bytes()[off] ^= 0xff
			}
		}
	}
	corrupt("one")
	corrupt("two")
	_, err := b.Get(ctx, "one")
	assert.Equal(t, storepb.ChecksumMismatch, codeOf(err), "%v", err)
	// Read straight into registered memory (no staging copy) too.
	reg := make([]byte, len(want))
	require.NoError(t, b.RegisterBuffer(reg))
	_, err = b.GetInto(ctx, "one", reg)
	assert.Equal(t, storepb.ChecksumMismatch, codeOf(err), "%v", err)
	// With a good replica elsewhere the read falls back to it, even from
	// the client holding the bad one nearest.
	for _, c := range []*Client{a, b} {
		got, err := c.Get(ctx, "two")
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	n, err := b.GetInto(ctx, "two", reg)
	require.NoError(t, err)
	assert.Equal(t, want, reg[:n])
	require.NoError(t, b.UnregisterBuffer(reg))
}

func TestPoolFull(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	pinned := &ReplicateConfig{HardPin: true}
	var stored []int
	var full error
	for i := range 100 {
		if err := a.Put(ctx, fmt.Sprintf("p%d", i), value(uint64(i), 256<<10), pinned); err != nil {
			full = err
			break
		}
		stored = append(stored, i)
	}
	require.Error(t, full, "a 4 MiB pool took 100 x 256 KiB")
	assert.Equal(t, storepb.NoAvailableHandle, codeOf(full), "%v", full)
	assert.GreaterOrEqual(t, len(stored), 14)
	for _, i := range stored {
		got, err := a.Get(ctx, fmt.Sprintf("p%d", i))
		require.NoError(t, err)
		require.Equal(t, value(uint64(i), 256<<10), got)
	}
	// Unpinned objects make room by eviction instead.
	require.Equal(t, len(stored), mustRemoveAll(t, a))
	for i := range 100 {
		require.NoError(t, a.Put(ctx, fmt.Sprintf("e%d", i), value(uint64(i), 256<<10), nil))
	}
}

func mustRemoveAll(t *testing.T, c *Client) int {
	n, err := c.RemoveAll(ctxT(t), true)
	require.NoError(t, err)
	return n
}

func TestConcurrentClients(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	cs := []*Client{newClient(t, m.Addr(), 32<<20), newClient(t, m.Addr(), 32<<20), newClient(t, m.Addr(), NoSegment)}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := range 6 {
		wg.Go(func() {
			c := cs[g%len(cs)]
			for i := range 40 {
				key := fmt.Sprintf("g%d-%d", g, i)
				want := value(uint64(g<<16|i), 1000+i*97)
				if err := c.Put(ctx, key, want, &ReplicateConfig{Replicas: 1 + i%2}); err != nil {
					errc <- err
					return
				}
				got, err := cs[(g+1)%len(cs)].Get(ctx, key)
				if err != nil || !bytes.Equal(got, want) {
					errc <- fmt.Errorf("%s: %v (equal %v)", key, err, bytes.Equal(got, want))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func TestCloseUnmounts(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "on-b", value(1, 100), &ReplicateConfig{PreferredSegments: []string{b.SegmentName()}}))
	require.Equal(t, 2, m.Service().Stats().Segments)
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	assert.Equal(t, 1, m.Service().Stats().Segments)
	_, err := a.Get(ctx, "on-b")
	assert.Equal(t, storepb.ObjectNotFound, codeOf(err), "%v", err)
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		bad  string // substring of the error; "" for valid
	}{
		{"ok", Config{Master: "127.0.0.1:1"}, ""},
		{"no master", Config{}, "Master"},
		{"etcd without endpoints", Config{Master: "etcd://"}, "etcd"},
		{"negative segment", Config{Master: "x:1", SegmentSize: -5}, "SegmentSize"},
		{"pure client", Config{Master: "x:1", SegmentSize: NoSegment}, ""},
		{"negative buffer", Config{Master: "x:1", LocalBufferSize: -1}, "LocalBufferSize"},
		{"negative timeout", Config{Master: "x:1", RPCTimeout: -1}, "RPCTimeout"},
		{"negative replicas", Config{Master: "x:1", Replicate: ReplicateConfig{Replicas: -1}}, "Replicas"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.bad == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.bad)
		})
	}
}

func TestMasterDownGivesRPCError(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20, func(c *Config) { c.RPCTimeout = 500 * time.Millisecond })
	require.NoError(t, m.Close())
	err := a.Put(ctxT(t), "k", []byte("v"), nil)
	require.Error(t, err)
	assert.Contains(t, []storepb.Code{storepb.RPCFail, storepb.RPCTimeout}, codeOf(err), "%v", err)
}

// TestNewFailsCleanly: a client whose master does not answer gives up with
// an error (no panic) and stops the engine it started.
func TestNewFailsCleanly(t *testing.T) {
	addr := nettest.RefusedAddr(t) // nothing listens there
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := New(ctx, Config{Master: addr, SegmentSize: 1 << 20, LocalBufferSize: 1 << 20,
		RPCTimeout: 500 * time.Millisecond, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.Error(t, err)
	assert.Contains(t, []storepb.Code{storepb.RPCFail, storepb.RPCTimeout}, codeOf(err), "%v", err)
	require.Nil(t, c)
}

// TestCloseWhileReading: Close waits for the gets and puts in progress
// (they use the staging buffer and the segment it frees), and later ones
// fail with a clear error instead of touching freed memory.
func TestCloseWhileReading(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	owner := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	want := value(7, 300<<10)
	require.NoError(t, owner.Put(ctx, "v", want, nil))
	c, err := New(ctx, Config{Master: m.Addr(), SegmentSize: NoSegment, LocalBufferSize: 8 << 20,
		EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var busy sync.WaitGroup // done once each goroutine finished one call
	busy.Add(4)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				if i == 1 {
					busy.Done()
				}
				var err error
				if g == 0 {
					err = c.Put(ctx, fmt.Sprintf("p%d", i), want[:4096], nil)
				} else {
					var got []byte
					if got, err = c.Get(ctx, "v"); err == nil && !bytes.Equal(got, want) {
						t.Error("wrong bytes")
						return
					}
				}
				if err != nil {
					assert.ErrorIs(t, err, ErrClosed)
					if i == 0 {
						busy.Done()
					}
					return
				}
			}
		})
	}
	busy.Wait()
	require.NoError(t, c.Close())
	wg.Wait()
}

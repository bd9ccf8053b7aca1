package client

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// span is one call of spans' fn, for comparison.
type span struct {
	seg              string
	remote, at, size uint64
}

func spansOf(m *storepb.MemoryReplica, off, n uint64) []span {
	var out []span
	spans(m, off, n, func(p *storepb.MemoryReplica, remote, at, n uint64) {
		out = append(out, span{p.SegmentName, remote, at, n})
	})
	return out
}

func TestSpans(t *testing.T) {
	plain := &storepb.MemoryReplica{SegmentName: "p", BufferAddress: 1000, Size: 100}
	// Pieces of 40, 40, 40 and a short last one of 10: 130 bytes.
	striped := &storepb.MemoryReplica{SegmentName: "a", BufferAddress: 1000, Size: 130, Stripes: []*storepb.MemoryReplica{
		{SegmentName: "a", BufferAddress: 1000, Size: 40},
		{SegmentName: "b", BufferAddress: 5000, Size: 40},
		{SegmentName: "c", BufferAddress: 9000, Size: 40},
		{SegmentName: "d", BufferAddress: 200, Size: 10},
	}}
	for _, tc := range []struct {
		name   string
		m      *storepb.MemoryReplica
		off, n uint64
		want   []span
	}{
		// An ordinary replica is its own one piece.
		{"plain whole", plain, 0, 100, []span{{"p", 1000, 0, 100}}},
		{"plain inside", plain, 30, 20, []span{{"p", 1030, 30, 20}}},
		{"plain empty", plain, 30, 0, nil},
		{"whole", striped, 0, 130, []span{{"a", 1000, 0, 40}, {"b", 5000, 40, 40}, {"c", 9000, 80, 40}, {"d", 200, 120, 10}}},
		// Within one piece, away from its edges.
		{"inside one", striped, 45, 10, []span{{"b", 5005, 45, 10}}},
		// Exactly one piece, from its first byte to its last.
		{"one piece exactly", striped, 40, 40, []span{{"b", 5000, 40, 40}}},
		// Ends on a boundary, starts on one.
		{"up to a boundary", striped, 30, 10, []span{{"a", 1030, 30, 10}}},
		{"from a boundary", striped, 80, 5, []span{{"c", 9000, 80, 5}}},
		// Across three pieces, cut inside the first and the last.
		{"across", striped, 39, 43, []span{{"a", 1039, 39, 1}, {"b", 5000, 40, 40}, {"c", 9000, 80, 2}}},
		// Into the short last piece, to the value's end.
		{"short last", striped, 110, 20, []span{{"c", 9030, 110, 10}, {"d", 200, 120, 10}}},
		{"last byte", striped, 129, 1, []span{{"d", 209, 129, 1}}},
		{"empty", striped, 40, 0, nil},
		{"empty at end", striped, 130, 0, nil},
		// Past the pieces: nothing beyond them is yielded.
		{"past the end", striped, 125, 20, []span{{"d", 205, 125, 5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, spansOf(tc.m, tc.off, tc.n))
		})
	}
	assert.Equal(t, uint64(130), replicaLen(striped))
	assert.Equal(t, uint64(100), replicaLen(plain))
}

// TestSpansPlainAllocatesNothing: the common path, an ordinary replica,
// costs no allocation per read or write.
func TestSpansPlainAllocatesNothing(t *testing.T) {
	plain := &storepb.MemoryReplica{SegmentName: "p", BufferAddress: 1000, Size: 100}
	var sum uint64
	allocs := testing.AllocsPerRun(100, func() {
		spans(plain, 10, 50, func(_ *storepb.MemoryReplica, remote, at, n uint64) { sum += remote + at + n })
	})
	assert.Zero(t, allocs)
	assert.NotZero(t, sum)
}

// stripedOver returns a striped replica whose pieces, of sizes sizes, lie
// in the segments of owners (in order): each the allocation of a filler
// object put there, so that the test owns the space. It stands for what
// the master places, to exercise the client's data path alone.
func stripedOver(t *testing.T, m *master.Server, w *Client, owners []*Client, sizes []uint64) *storepb.MemoryReplica {
	t.Helper()
	ctx := ctxT(t)
	rep := &storepb.MemoryReplica{}
	for i, o := range owners {
		key := fmt.Sprintf("filler-%s-%d", t.Name(), i)
		require.NoError(t, w.Put(ctx, key, make([]byte, sizes[i]), &ReplicateConfig{PreferredSegments: []string{o.SegmentName()}}))
		reps, _, _, _, err := m.Service().GetReplicaList(key)
		require.NoError(t, err)
		p := reps[0].GetMemory()
		require.Equal(t, o.SegmentName(), p.SegmentName, "filler %d placed elsewhere", i)
		rep.Stripes = append(rep.Stripes, p)
		rep.Size += p.Size
	}
	rep.SegmentName, rep.TransportEndpoint, rep.BufferAddress = rep.Stripes[0].SegmentName, rep.Stripes[0].TransportEndpoint, rep.Stripes[0].BufferAddress
	return rep
}

// pieceBytes is the memory of piece p of a replica, in its owner's
// segment.
func pieceBytes(owner *Client, p *storepb.MemoryReplica) []byte {
	off := p.BufferAddress - uint64(owner.segBuf.Addr())
	return owner.segBuf.Bytes()[off : off+p.Size]
}

// TestStripedDataPath writes values into a striped replica and reads them
// back by every path of the client, with the replica made by hand (the
// master's placement is not under test here): pieces on four segments,
// one of them the writer's and reader's own (a mixed replica), the last
// piece shorter, staging slices (256 KiB) that do not fit the pieces.
func TestStripedDataPath(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	small := func(c *Config) { c.LocalBufferSize = 1 << 20 }
	a, b, d := newClient(t, m.Addr(), 8<<20), newClient(t, m.Addr(), 8<<20), newClient(t, m.Addr(), 8<<20)
	w := newClient(t, m.Addr(), 8<<20, small)         // holds piece 0
	r := newClient(t, m.Addr(), NoSegment, small)     // holds none
	const piece = 160 << 10                           // not a multiple of a staging slice
	sizes := []uint64{piece, piece, piece, 120 << 10} // 600 KiB
	owners := []*Client{w, a, b, d}
	rep := stripedOver(t, m, w, owners, sizes)
	n := int(replicaLen(rep))
	ctx := ctxT(t)
	reps := []*storepb.Replica{{Status: storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE, Location: &storepb.Replica_Memory{Memory: rep}}}

	// checkPieces checks that every piece holds its stretch of want.
	checkPieces := func(t *testing.T, want []byte) {
		t.Helper()
		at := 0
		for i, p := range rep.Stripes {
			require.Equal(t, want[at:at+int(p.Size)], pieceBytes(owners[i], p), "piece %d", i)
			at += int(p.Size)
		}
	}
	reg := make([]byte, n)
	require.NoError(t, w.RegisterBuffer(reg))
	t.Cleanup(func() { _ = w.UnregisterBuffer(reg) })
	// Puts: each case writes a fresh value (seed) through one path and
	// checks the bytes in the pieces and the checksum the put reports.
	for i, tc := range []struct {
		name string
		item func(v []byte) *putItem
	}{
		// Go memory: staged in slices that straddle pieces.
		{"staged", func(v []byte) *putItem { return &putItem{value: v} }},
		// Registered memory: written from where it is.
		{"registered", func(v []byte) *putItem { copy(reg, v); return &putItem{value: reg} }},
		// Parts whose boundaries fall inside pieces (the first two large
		// enough to be summed by the writes, the last by the caller).
		{"parts", func(v []byte) *putItem {
			copy(reg, v)
			return &putItem{parts: [][]byte{reg[:200<<10], reg[200<<10 : 500<<10], reg[500<<10 : 500<<10], reg[500<<10:]}}
		}},
	} {
		t.Run("put "+tc.name, func(t *testing.T) {
			want := value(uint64(100+i), n)
			it := tc.item(want)
			it.key, it.reps, it.started = "striped", reps, true
			require.NoError(t, w.locate(it))
			require.True(t, it.late, "600 KiB is summed by the writes")
			w.write(ctx, []*putItem{it})
			require.NoError(t, it.err)
			require.False(t, it.unsummed)
			// The writes' sums, folded by position, are the value's.
			assert.Equal(t, checksum(want), it.lateChecksum())
			checkPieces(t, want)
		})
	}

	want := value(7, n)
	it := &putItem{key: "striped", value: want, reps: reps, started: true}
	require.NoError(t, w.locate(it))
	w.write(ctx, []*putItem{it})
	require.NoError(t, it.err)
	checkPieces(t, want)
	sum := checksum(want)
	rreg := make([]byte, n)
	require.NoError(t, r.RegisterBuffer(rreg))
	t.Cleanup(func() { _ = r.UnregisterBuffer(rreg) })

	// read reads the value with c into the item's memory, from the
	// striped replica, verified against sum.
	read := func(c *Client, g *getItem) error {
		g.key, g.length, g.sum, g.reps = "striped", uint64(n), sum, []*storepb.MemoryReplica{rep}
		c.readAll(ctx, []*getItem{g})
		if g.err == nil && !g.done {
			return fmt.Errorf("not done")
		}
		return g.err
	}
	for _, c := range []struct {
		name string
		c    *Client
		reg  []byte
	}{{"mixed", w, reg}, {"remote", r, rreg}} {
		t.Run("get "+c.name, func(t *testing.T) {
			// Get: a buffer of the client's own.
			g := &getItem{alloc: true}
			require.NoError(t, read(c.c, g))
			assert.Equal(t, want, g.dst[:n])
			// GetInto Go memory: through the staging buffer.
			g = &getItem{dst: make([]byte, n)}
			require.NoError(t, read(c.c, g))
			assert.Equal(t, want, g.dst)
			// GetInto registered memory: straight in.
			clear(c.reg)
			g = &getItem{dst: c.reg}
			require.NoError(t, read(c.c, g))
			assert.Equal(t, want, c.reg)
			// Parts, cut elsewhere than the pieces.
			clear(c.reg)
			g = &getItem{parts: [][]byte{c.reg[:1], c.reg[1 : 170<<10], c.reg[170<<10 : 170<<10], c.reg[170<<10:]}}
			require.NoError(t, read(c.c, g))
			assert.Equal(t, want, c.reg)
			// Ranges: inside a piece, across three, the short last piece,
			// into Go memory and registered memory.
			clear(c.reg)
			rs := []Range{
				{Src: 10, Dst: make([]byte, 100)},
				{Src: piece - 7, Dst: c.reg[:2*piece+14]},
				{Src: uint64(n) - 130<<10, Dst: make([]byte, 130<<10)},
			}
			g = &getItem{ranges: rs}
			require.NoError(t, read(c.c, g))
			for i, rg := range rs {
				assert.Equal(t, want[rg.Src:rg.Src+uint64(len(rg.Dst))], rg.Dst, "range %d", i)
			}
		})
	}
	// A byte flipped in any one piece fails the checksum, whichever
	// path reads it: the sum folds every piece in at its place.
	for i, p := range rep.Stripes {
		t.Run(fmt.Sprintf("corrupt piece %d", i), func(t *testing.T) {
			mem := pieceBytes(owners[i], p)
			mem[p.Size/2] ^= 0xff
			defer func() { mem[p.Size/2] ^= 0xff }()
			for _, c := range []*Client{w, r} {
				for _, g := range []*getItem{{alloc: true}, {dst: make([]byte, n)}, {parts: [][]byte{rreg[:300<<10], rreg[300<<10:]}}} {
					if g.parts != nil && c != r {
						continue
					}
					err := read(c, g)
					assert.Equal(t, storepb.ChecksumMismatch, codeOf(err), "%v", err)
				}
			}
		})
	}
}

// TestStripedAllHere: a striped replica whose pieces all lie in the
// writer's own segment is written by plain copies alone (no engine), and
// its late checksum is the caller's.
func TestStripedAllHere(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	w := newClient(t, m.Addr(), 8<<20)
	sizes := []uint64{200 << 10, 200 << 10, 100 << 10}
	rep := stripedOver(t, m, w, []*Client{w, w, w}, sizes)
	reps := []*storepb.Replica{{Location: &storepb.Replica_Memory{Memory: rep}}}
	require.False(t, w.needsEngine(reps))
	rep.Stripes[1].SegmentName = "elsewhere"
	require.True(t, w.needsEngine(reps), "one piece elsewhere needs the engine")
	rep.Stripes[1].SegmentName = w.SegmentName()

	want := value(9, int(replicaLen(rep)))
	it := &putItem{key: "here", value: want, reps: reps, started: true}
	require.NoError(t, w.locate(it))
	w.write(ctxT(t), []*putItem{it})
	require.NoError(t, it.err)
	assert.Equal(t, checksum(want), it.lateChecksum())
	at := 0
	for i, p := range rep.Stripes {
		assert.Equal(t, want[at:at+int(p.Size)], pieceBytes(w, p), "piece %d", i)
		at += int(p.Size)
	}
	g := &getItem{key: "here", alloc: true, length: uint64(len(want)), sum: checksum(want), reps: []*storepb.MemoryReplica{rep}}
	w.readAll(ctxT(t), []*getItem{g})
	require.NoError(t, g.err)
	assert.Equal(t, want, g.dst)
	assert.Zero(t, w.distance(rep), "all pieces here: nearest")
	rep.Stripes[2].SegmentName = "elsewhere"
	assert.Equal(t, 1, w.distance(rep), "a piece in another process of this host")
	rep.Stripes[2].TransportEndpoint = "192.0.2.1:1"
	assert.Equal(t, 2, w.distance(rep), "a piece on another host: elsewhere")
}

// stripedCluster is a master and storage nodes, each a client with a
// segment of its own, reached over TCP.
type stripedCluster struct {
	m     *master.Server
	nodes []*Client
}

func tcpEngine(c *Config) { c.EngineConfig = engine.Config{Host: "127.0.0.1", Transport: "tcp"} }

func newStripedCluster(t *testing.T, cfg master.ServiceConfig, nodes int) *stripedCluster {
	t.Helper()
	sc := &stripedCluster{m: startMaster(t, cfg)}
	for range nodes {
		sc.nodes = append(sc.nodes, newClient(t, sc.m.Addr(), 8<<20, tcpEngine))
	}
	return sc
}

// owner is the node whose segment holds piece p.
func (sc *stripedCluster) owner(t *testing.T, p *storepb.MemoryReplica) *Client {
	t.Helper()
	for _, n := range sc.nodes {
		if n.SegmentName() == p.SegmentName {
			return n
		}
	}
	t.Fatalf("no node holds segment %s", p.SegmentName)
	return nil
}

// replicas is key's memory replicas as the master lists them.
func (sc *stripedCluster) replicas(t *testing.T, key string) []*storepb.MemoryReplica {
	t.Helper()
	reps, _, _, _, err := sc.m.Service().GetReplicaList(key)
	require.NoError(t, err)
	var out []*storepb.MemoryReplica
	for _, r := range reps {
		out = append(out, r.GetMemory())
	}
	return out
}

// requireStriped fails unless every replica of key is cut into n pieces
// on distinct segments: a test of striped reads must read striped
// replicas.
func (sc *stripedCluster) requireStriped(t *testing.T, key string, n int) []*storepb.MemoryReplica {
	t.Helper()
	reps := sc.replicas(t, key)
	for _, m := range reps {
		require.Len(t, m.Stripes, n, "%s: pieces", key)
		segs := map[string]bool{}
		for _, p := range m.Stripes {
			segs[p.SegmentName] = true
		}
		require.Len(t, segs, n, "%s: pieces on distinct segments", key)
	}
	return reps
}

// TestStripedThroughTheMaster puts values with Stripes: 4 over four
// nodes and reads them back by every read path, from a client holding no
// piece and from a node holding one (a mixed replica: one piece copied
// within the process, three read by the engine).
func TestStripedThroughTheMaster(t *testing.T) {
	sc := newStripedCluster(t, master.ServiceConfig{}, 4)
	x := newClient(t, sc.m.Addr(), NoSegment, tcpEngine)
	ctx := ctxT(t)
	rc := &ReplicateConfig{Stripes: 4}
	// Lengths that are no multiple of the pieces: the last one is short.
	sizes := map[string]int{"s-1m": 1<<20 + 123, "s-600k": 600 << 10, "s-256k1": 256<<10 + 1}
	vals := map[string][]byte{}
	var keys []string
	for k, n := range sizes {
		vals[k] = value(uint64(n), n)
		keys = append(keys, k)
	}
	for _, k := range keys {
		require.NoError(t, x.Put(ctx, k, vals[k], rc), k)
		reps := sc.requireStriped(t, k, 4)
		last := reps[0].Stripes[3]
		require.Less(t, last.Size, reps[0].Stripes[0].Size, "%s: a shorter last piece", k)
	}
	// From registered memory, and from parts.
	reg := make([]byte, 2<<20)
	require.NoError(t, x.RegisterBuffer(reg))
	t.Cleanup(func() { _ = x.UnregisterBuffer(reg) })
	copy(reg, value(77, 1<<20))
	require.NoError(t, x.PutFrom(ctx, "s-from", reg[:1<<20], rc))
	vals["s-from"] = slices.Clone(reg[:1<<20])
	parts := [][]byte{reg[1<<20 : 1<<20+100], reg[1<<20+100 : 1<<20+300<<10], reg[1<<20+300<<10 : 2<<20-5]}
	for i, p := range parts {
		copy(p, value(uint64(80+i), len(p)))
	}
	require.Equal(t, []error{nil}, x.BatchPutFromParts(ctx, []string{"s-parts"}, [][][]byte{parts}, rc))
	vals["s-parts"] = slices.Concat(parts...)
	// A writer holding the first piece (the top-level names are its):
	// the replica is still written by the engine, its piece here by a
	// plain copy.
	w := sc.nodes[0]
	vals["s-mixed-put"] = value(99, 700<<10)
	require.NoError(t, w.Put(ctx, "s-mixed-put", vals["s-mixed-put"], &ReplicateConfig{Stripes: 4, PreferredSegments: []string{w.SegmentName()}}))
	require.Equal(t, w.SegmentName(), sc.replicas(t, "s-mixed-put")[0].SegmentName)
	keys = append(keys, "s-from", "s-parts", "s-mixed-put")
	for _, k := range keys[3:] {
		sc.requireStriped(t, k, 4)
	}
	// A node holding one piece of "s-1m" reads it as a mixed replica.
	mixed := sc.owner(t, sc.replicas(t, "s-1m")[0].Stripes[1])
	for _, rd := range []struct {
		name string
		c    *Client
	}{{"remote", x}, {"mixed", mixed}} {
		t.Run(rd.name, func(t *testing.T) {
			c := rd.c
			dreg := make([]byte, 2<<20)
			require.NoError(t, c.RegisterBuffer(dreg))
			defer func() { _ = c.UnregisterBuffer(dreg) }()
			for _, k := range keys {
				want := vals[k]
				got, err := c.Get(ctx, k)
				require.NoError(t, err, k)
				require.Equal(t, want, got, "Get %s", k)
				// GetInto Go memory (staged) and registered memory.
				buf := make([]byte, len(want)+10)
				n, err := c.GetInto(ctx, k, buf)
				require.NoError(t, err, k)
				require.Equal(t, want, buf[:n], "GetInto %s", k)
				clear(dreg)
				n, err = c.GetInto(ctx, k, dreg)
				require.NoError(t, err, k)
				require.Equal(t, want, dreg[:n], "GetInto registered %s", k)
				// Parts cut elsewhere than the pieces.
				clear(dreg)
				cut := len(want) / 3
				ns, errs := c.BatchGetIntoParts(ctx, []string{k}, [][][]byte{{dreg[:cut], dreg[cut : cut+7], dreg[cut+7 : len(want)]}})
				require.NoError(t, errs[0], k)
				require.Equal(t, len(want), ns[0])
				require.Equal(t, want, dreg[:len(want)], "parts %s", k)
				// Ranges: the first byte, across the middle, the tail.
				rs := []Range{{Src: 0, Dst: make([]byte, 1)}, {Src: uint64(cut - 3), Dst: make([]byte, cut)}, {Src: uint64(len(want) - 4097), Dst: dreg[:4097]}}
				_, errs = c.BatchGetRanges(ctx, []string{k}, [][]Range{rs})
				require.NoError(t, errs[0], k)
				for i, r := range rs {
					require.Equal(t, want[r.Src:r.Src+uint64(len(r.Dst))], r.Dst, "%s range %d", k, i)
				}
			}
			// All keys in one batch: the pieces of every key in one engine
			// batch.
			dsts := make([][]byte, len(keys))
			for i, k := range keys {
				dsts[i] = make([]byte, len(vals[k]))
			}
			ns, errs := c.BatchGetInto(ctx, keys, dsts)
			for i, k := range keys {
				require.NoError(t, errs[i], k)
				require.Equal(t, vals[k], dsts[i][:ns[i]], "BatchGetInto %s", k)
			}
		})
	}
	// A byte flipped in any one piece's memory, in its owner's segment,
	// fails the checksum: the sum covers every piece.
	for i, p := range sc.replicas(t, "s-1m")[0].Stripes {
		mem := pieceBytes(sc.owner(t, p), p)
		mem[len(mem)-1] ^= 0x01
		for _, c := range []*Client{x, mixed} {
			_, err := c.Get(ctx, "s-1m")
			assert.Equal(t, storepb.ChecksumMismatch, codeOf(err), "piece %d: %v", i, err)
			assert.ErrorContains(t, err, "striped replica on ")
			assert.ErrorContains(t, err, p.SegmentName)
		}
		mem[len(mem)-1] ^= 0x01
	}
	got, err := x.Get(ctx, "s-1m")
	require.NoError(t, err)
	require.Equal(t, vals["s-1m"], got)
}

// TestStripesConfig: Stripes is sent as stripe_count: 1 keeps a put
// whole under a master that stripes large values, 0 leaves it to that
// policy, a negative count is refused.
func TestStripesConfig(t *testing.T) {
	sc := newStripedCluster(t, master.ServiceConfig{StripeMinSize: 64 << 10, StripeCount: 3}, 3)
	c := sc.nodes[0]
	ctx := ctxT(t)
	v := value(3, 256<<10)
	require.NoError(t, c.Put(ctx, "policy", v, nil))
	sc.requireStriped(t, "policy", 3)
	require.NoError(t, c.Put(ctx, "whole", v, &ReplicateConfig{Stripes: 1}))
	assert.Empty(t, sc.replicas(t, "whole")[0].Stripes)
	require.NoError(t, c.Put(ctx, "two", v, &ReplicateConfig{Stripes: 2}))
	sc.requireStriped(t, "two", 2)
	for _, k := range []string{"policy", "whole", "two"} {
		got, err := c.Get(ctx, k)
		require.NoError(t, err, k)
		assert.Equal(t, v, got, k)
	}
	err := c.Put(ctx, "bad", v, &ReplicateConfig{Stripes: -1})
	assert.Equal(t, storepb.InvalidParams, codeOf(err), "%v", err)
	assert.ErrorContains(t, (&Config{Master: "x", Replicate: ReplicateConfig{Stripes: -2}}).Validate(), "Stripes")
}

// TestStripedPieceOwnerGone: a node holding a piece closes between the
// lookup (kept in the lease cache) and the read. With one replica the get
// fails with an error, not wrong bytes nor a hang; with two it falls back
// to the other.
func TestStripedPieceOwnerGone(t *testing.T) {
	sc := newStripedCluster(t, master.ServiceConfig{}, 6)
	x := newClient(t, sc.m.Addr(), NoSegment, tcpEngine)
	ctx := ctxT(t)
	one, two := value(1, 300<<10), value(2, 300<<10)
	require.NoError(t, x.Put(ctx, "one", one, &ReplicateConfig{Stripes: 3}))
	require.NoError(t, x.Put(ctx, "two", two, &ReplicateConfig{Stripes: 3, Replicas: 2}))
	sc.requireStriped(t, "one", 3)
	reps := sc.requireStriped(t, "two", 3)
	require.Len(t, reps, 2)
	// Cache both lists, in the order the reader tries them.
	for k, want := range map[string][]byte{"one": one, "two": two} {
		got, err := x.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	first := x.leases.get("two", time.Now())
	require.NotNil(t, first)
	// Close a node holding a piece of the replica of "two" tried first
	// and none of the other.
	other := map[string]bool{}
	for _, p := range first.reps[1].Stripes {
		other[p.SegmentName] = true
	}
	var gone *Client
	for _, p := range first.reps[0].Stripes {
		if !other[p.SegmentName] {
			gone = sc.owner(t, p)
			break
		}
	}
	require.NotNil(t, gone, "the replicas of two share every segment")
	oneRep := sc.replicas(t, "one")[0]
	require.NoError(t, gone.Close())
	got, err := x.Get(ctx, "two")
	require.NoError(t, err)
	assert.Equal(t, two, got)
	// "one" is read from its cached list, then looked up again; a node
	// holding one of its pieces is gone too.
	if !slices.ContainsFunc(oneRep.Stripes, func(p *storepb.MemoryReplica) bool { return p.SegmentName == gone.SegmentName() }) {
		require.NoError(t, sc.owner(t, oneRep.Stripes[0]).Close())
	}
	_, err = x.Get(ctx, "one")
	assert.Error(t, err)
}

// TestStripedPutSession writes a striped value layer by layer (a put
// session's ranges, large enough to be summed by their writes, each
// across pieces) and reads it back verified: the session's checksum is
// folded from the pieces' writes.
func TestStripedPutSession(t *testing.T) {
	sc := newStripedCluster(t, master.ServiceConfig{}, 4)
	x := newClient(t, sc.m.Addr(), NoSegment, tcpEngine)
	ctx := ctxT(t)
	want := value(11, 4*200<<10)
	require.NoError(t, x.StartPutSession(ctx, []string{"layers"}, []uint64{uint64(len(want))}, &ReplicateConfig{Stripes: 4})[0])
	// Five layers over four pieces: every layer but the first and last
	// straddles two. The last layer first: ranges may come in any order.
	rs := layers(want, 5, clone)
	slices.Reverse(rs)
	_, errs := x.BatchPutRanges(ctx, []string{"layers"}, [][]PutRange{rs})
	require.NoError(t, errs[0])
	require.NoError(t, x.EndPutSession(ctx, []string{"layers"})[0])
	sc.requireStriped(t, "layers", 4)
	_, _, sum, _, err := sc.m.Service().GetReplicaList("layers")
	require.NoError(t, err)
	require.Equal(t, checksum(want), sum)
	got, err := x.Get(ctx, "layers")
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// TestStripedGPU: values put from GPU memory (registered or staged by
// the driver) into replicas striped over four nodes, one the writer's
// own, and read back into GPU memory (registered or not) by that node
// and by a client holding no piece. The writer's and reader's own piece
// must move through the engine's local segment, never a CPU copy of GPU
// memory (the driver double faults on one).
func TestStripedGPU(t *testing.T) {
	sc := newStripedCluster(t, master.ServiceConfig{}, 4)
	x := newClient(t, sc.m.Addr(), NoSegment, tcpEngine)
	w := sc.nodes[0]
	ctx := ctxT(t)
	const n = 3<<20 + 11 // more than a staging piece (2 MiB here)
	src := gpuRegistered(t, w, 0, n)
	plain := gpuBuf(t, 0, n)
	rc := &ReplicateConfig{Stripes: 4, PreferredSegments: []string{w.SegmentName()}}
	for i, from := range map[string][]byte{"registered": src, "staged": plain} {
		t.Run(i, func(t *testing.T) {
			want := value(uint64(len(i)), n)
			toGPU(t, from, want)
			key := "gpu-" + i
			require.NoError(t, w.Put(ctx, key, from, rc))
			reps := sc.requireStriped(t, key, 4)
			require.True(t, slices.ContainsFunc(reps[0].Stripes, func(p *storepb.MemoryReplica) bool { return p.SegmentName == w.SegmentName() }),
				"the writer holds a piece")
			require.Equal(t, checksum(want), masterSum(t, sc.m, key))
			for _, c := range []*Client{w, x} {
				for _, reg := range []bool{true, false} {
					dst := gpuBuf(t, 1, n)
					if reg {
						dst = gpuRegistered(t, c, 1, n)
					}
					got, err := c.GetInto(ctx, key, dst)
					require.NoError(t, err)
					require.Equal(t, n, got)
					require.True(t, bytes.Equal(want, fromGPU(t, dst)), "%s registered=%v", c.SegmentName(), reg)
				}
			}
		})
	}
}

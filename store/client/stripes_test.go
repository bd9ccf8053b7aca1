package client

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	w := newClient(t, m.Addr(), 8<<20, small)         // holds piece 1
	r := newClient(t, m.Addr(), NoSegment, small)     // holds none
	const piece = 160 << 10                           // not a multiple of a staging slice
	sizes := []uint64{piece, piece, piece, 120 << 10} // 600 KiB
	owners := []*Client{a, w, b, d}
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

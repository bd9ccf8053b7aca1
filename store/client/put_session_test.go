package client

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// layers cuts want into n equal ranges, the way a KV cache is written one
// layer at a time; src gives the memory each range is written from.
func layers(want []byte, n int, src func(b []byte) []byte) []PutRange {
	size := len(want) / n
	out := make([]PutRange, n)
	for i := range out {
		out[i] = PutRange{Dst: uint64(i * size), Src: src(want[i*size : (i+1)*size])}
	}
	return out
}

// clone is a range's bytes in memory of their own (not registered).
func clone(b []byte) []byte { return append([]byte(nil), b...) }

func TestPutSession(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 32<<20)
	peer := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.EngineConfig.Transport = "tcp" })
	ctx := ctxT(t)
	reg := guarded(4 << 20)
	require.NoError(t, peer.RegisterBuffer(reg))
	// inReg copies a range's bytes into the first half of reg, 16 bytes
	// apart; the second half stays as it was.
	next := 0
	inReg := func(b []byte) []byte {
		next += 16
		p := reg[next : next+len(b) : next+len(b)]
		next += len(b)
		copy(p, b)
		return p
	}
	for _, c := range []struct {
		name   string
		writer *Client
		src    func(b []byte) []byte // where a range's bytes are written from
	}{
		{"own segment", a, clone},
		{"tcp, staged", peer, clone},
		{"tcp, registered", peer, inReg},
	} {
		t.Run(c.name, func(t *testing.T) {
			k1, k2 := c.name+"/1", c.name+"/2"
			v1, v2 := value(1, 8*40000), value(2, 8*1000+3)
			errs := c.writer.StartPutSession(ctx, []string{k1, k2}, []uint64{uint64(len(v1)), uint64(len(v2))}, nil)
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			// Reserved, not readable.
			_, err := a.Get(ctx, k1)
			assert.ErrorIs(t, err, storepb.ErrObjectNotFound)
			// The layers of k1 last to first, one call per layer; k2 in
			// one call of two uneven ranges.
			r1 := layers(v1, 8, c.src)
			for i := len(r1) - 1; i >= 0; i-- {
				rs := [][]PutRange{{r1[i]}, nil}
				if i == 0 {
					rs[1] = []PutRange{{Dst: 5000, Src: c.src(v2[5000:])}, {Dst: 0, Src: c.src(v2[:5000])}}
				}
				ns, errs := c.writer.BatchPutRanges(ctx, []string{k1, k2}, rs)
				require.NoError(t, errs[0])
				require.NoError(t, errs[1])
				assert.Equal(t, len(r1[i].Src), ns[0])
				if i == 0 {
					assert.Equal(t, len(v2), ns[1])
				}
			}
			errs = c.writer.EndPutSession(ctx, []string{k1, k2})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			for k, want := range map[string][]byte{k1: v1, k2: v2} {
				got, err := a.Get(ctx, k)
				require.NoError(t, err)
				assert.Equal(t, want, got, k)
				// The pieces tile the value: the master keeps the checksum
				// of the whole.
				_, _, sum, _, err := m.Service().GetReplicaList(k)
				require.NoError(t, err)
				assert.Equal(t, checksum(want), sum, k)
			}
			guardsIntact(t, reg[len(reg)/2:], nil)
		})
	}
}

func TestPutSessionErrors(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "exists", []byte("x"), nil))

	errs := a.StartPutSession(ctx, []string{"", "zero", "exists", "s", "s", "huge"}, []uint64{8, 0, 8, 8, 8, 1 << 40}, nil)
	for i, want := range []storepb.Code{
		storepb.InvalidParams,       // empty key
		storepb.InvalidParams,       // zero size
		storepb.ObjectAlreadyExists, // the key exists
		storepb.OK,                  // opened
		storepb.ObjectAlreadyExists, // twice in one start
		storepb.NoAvailableHandle,   // more than the pool
	} {
		assert.Equal(t, want, codeOf(errs[i]), "key %d: %v", i, errs[i])
	}
	// A key whose session is open.
	assert.Equal(t, storepb.InvalidParams, codeOf(a.StartPutSession(ctx, []string{"s"}, []uint64{8}, nil)[0]))
	// Keys and sizes differ in number.
	assert.Equal(t, storepb.InvalidParams, codeOf(a.StartPutSession(ctx, []string{"t"}, []uint64{8, 8}, nil)[0]))

	for _, c := range []struct {
		name string
		keys []string
		rs   [][]PutRange
	}{
		{"no session", []string{"nope"}, [][]PutRange{{{Dst: 0, Src: []byte("a")}}}},
		{"past the end", []string{"s"}, [][]PutRange{{{Dst: 0, Src: []byte("ok")}, {Dst: 4, Src: []byte("12345")}}}},
		{"offset past the end", []string{"s"}, [][]PutRange{{{Dst: 9, Src: nil}}}},
		{"lists differ in number", []string{"s"}, nil},
	} {
		ns, errs := a.BatchPutRanges(ctx, c.keys, c.rs)
		assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]), c.name)
		assert.Zero(t, ns[0], c.name)
	}
	// Nothing of the refused range was written: its first piece is not
	// in the value.
	require.NoError(t, a.EndPutSession(ctx, []string{"s"})[0])
	got, err := a.Get(ctx, "s")
	require.NoError(t, err)
	assert.NotEqual(t, "ok", string(got[:2]))

	// End and revoke need a session; one ended or revoked is gone.
	for _, k := range []string{"s", "nope"} {
		assert.Equal(t, storepb.InvalidParams, codeOf(a.EndPutSession(ctx, []string{k})[0]), k)
		assert.Equal(t, storepb.InvalidParams, codeOf(a.RevokePutSession(ctx, []string{k})[0]), k)
	}
}

func TestPutSessionRevoke(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	require.NoError(t, a.StartPutSession(ctx, []string{"r"}, []uint64{3 << 20}, nil)[0])
	_, errs := a.BatchPutRanges(ctx, []string{"r"}, [][]PutRange{{{Dst: 0, Src: value(1, 1<<20)}}})
	require.NoError(t, errs[0])
	require.NoError(t, a.RevokePutSession(ctx, []string{"r"})[0])
	_, err := a.Get(ctx, "r")
	assert.Equal(t, storepb.ObjectNotFound, codeOf(err), "%v", err)
	_, errs = a.BatchPutRanges(ctx, []string{"r"}, [][]PutRange{{{Dst: 0, Src: []byte("a")}}})
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
	// The space came back: a 4 MiB pool holds another 3 MiB object.
	require.NoError(t, a.Put(ctx, "after", value(2, 3<<20), nil))
}

// Pieces that do not tile the value seal it without a checksum; pieces
// that do give the checksum of the whole, which catches a corrupted
// replica.
func TestPutSessionChecksum(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	want := value(9, 1000)
	on := &ReplicateConfig{PreferredSegments: []string{a.SegmentName()}}
	for _, c := range []struct {
		key string
		rs  []PutRange
		sum uint32
	}{
		// Exactly once, out of order.
		{"tiled", []PutRange{{600, want[600:]}, {0, want[:600]}}, checksum(want)},
		// The last 10 bytes never written.
		{"gap", []PutRange{{0, want[:990]}}, 0},
		// Written twice over a part: the last write wins, no checksum.
		{"overlap", []PutRange{{0, want}, {100, want[100:200]}}, 0},
		// Nothing written.
		{"empty", nil, 0},
	} {
		require.NoError(t, a.StartPutSession(ctx, []string{c.key}, []uint64{1000}, on)[0], c.key)
		_, errs := a.BatchPutRanges(ctx, []string{c.key}, [][]PutRange{c.rs})
		require.NoError(t, errs[0], c.key)
		require.NoError(t, a.EndPutSession(ctx, []string{c.key})[0], c.key)
		_, _, sum, _, err := m.Service().GetReplicaList(c.key)
		require.NoError(t, err)
		assert.Equal(t, c.sum, sum, c.key)
		_, err = b.Get(ctx, c.key)
		require.NoError(t, err, c.key)
	}
	// The same range written again replaces its piece.
	require.NoError(t, a.StartPutSession(ctx, []string{"again"}, []uint64{1000}, on)[0])
	for _, src := range [][]byte{value(10, 1000), want} {
		_, errs := a.BatchPutRanges(ctx, []string{"again"}, [][]PutRange{{{0, src}}})
		require.NoError(t, errs[0])
	}
	require.NoError(t, a.EndPutSession(ctx, []string{"again"})[0])
	got, err := b.Get(ctx, "again")
	require.NoError(t, err)
	assert.Equal(t, want, got)

	// Flip a byte of the tiled value's replica: the read fails.
	reps, _, _, _, err := m.Service().GetReplicaList("tiled")
	require.NoError(t, err)
	mr := reps[0].GetMemory()
	a.segBuf.Bytes()[mr.BufferAddress-uint64(a.segBuf.Addr())+700] ^= 0xff
	_, err = b.Get(ctx, "tiled")
	assert.Equal(t, storepb.ChecksumMismatch, codeOf(err), "%v", err)
}

// Writes of many goroutines into one session's layers, and ends racing
// none: -race checks the session state.
func TestPutSessionConcurrentRanges(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	peer := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.EngineConfig.Transport = "tcp" })
	ctx := ctxT(t)
	want := value(4, 64*4096)
	require.NoError(t, peer.StartPutSession(ctx, []string{"c"}, []uint64{uint64(len(want))}, nil)[0])
	var wg sync.WaitGroup
	for i, r := range layers(want, 64, clone) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs := peer.BatchPutRanges(ctx, []string{"c"}, [][]PutRange{{r}})
			assert.NoError(t, errs[0], "layer %d", i)
		}()
	}
	wg.Wait()
	require.NoError(t, peer.EndPutSession(ctx, []string{"c"})[0])
	got, err := a.Get(ctx, "c")
	require.NoError(t, err)
	assert.Equal(t, want, got)
	_, _, sum, _, err := m.Service().GetReplicaList("c")
	require.NoError(t, err)
	assert.Equal(t, checksum(want), sum)
}

// Close revokes the sessions still open: their keys can be put at once.
func TestCloseRevokesPutSessions(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	w := newClient(t, m.Addr(), NoSegment)
	keys := []string{"open/0", "open/1"}
	for i, err := range w.StartPutSession(ctx, keys, []uint64{1 << 20, 1 << 20}, nil) {
		require.NoError(t, err, keys[i])
	}
	require.NoError(t, w.Close())
	for i, k := range keys {
		require.NoError(t, a.Put(ctx, k, value(uint64(i), 100), nil))
		got, err := a.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, value(uint64(i), 100), got, k)
	}
}

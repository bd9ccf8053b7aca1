package client

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// carve cuts parts of the given sizes out of buf, with a guard gap of gap
// bytes before each one, and returns them.
func carve(buf []byte, gap int, sizes ...int) [][]byte {
	var out [][]byte
	off := 0
	for _, n := range sizes {
		off += gap
		out = append(out, buf[off:off+n:off+n])
		off += n
	}
	return out
}

func concat(parts [][]byte) []byte { return bytes.Join(parts, nil) }

// guarded fills buf with 0xee so that bytes no read may touch can be
// checked afterwards.
func guarded(n int) []byte { return bytes.Repeat([]byte{0xee}, n) }

// guardsIntact reports whether every byte of buf outside parts is still
// 0xee.
func guardsIntact(t *testing.T, buf []byte, parts [][]byte) {
	t.Helper()
	inside := make([]bool, len(buf))
	start := engine.AddrOf(buf)
	for _, p := range parts {
		if len(p) == 0 {
			continue
		}
		off := int(engine.AddrOf(p) - start)
		for i := range p {
			inside[off+i] = true
		}
	}
	for i, b := range buf {
		if !inside[i] && b != 0xee {
			t.Fatalf("byte %d outside the parts was written (%#x)", i, b)
		}
	}
}

func TestPartsRoundTrip(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 32<<20)
	b := newClient(t, m.Addr(), 32<<20)
	pure := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.EngineConfig.Transport = "tcp" })
	ctx := ctxT(t)

	// Odd sizes, an empty part, and parts larger than an engine slice (the
	// engine checksums slices as they land).
	sizes := [][]int{
		{1, 63, 0, 4097, 3},
		{600 << 10, 1, 300<<10 + 7},
		{12345},
	}
	for _, w := range []*Client{a, pure} {
		for _, replicas := range []int{1, 2} {
			src := make([]byte, 4<<20)
			require.NoError(t, w.RegisterBuffer(src))
			var keys []string
			var parts [][][]byte
			off := 0
			for i, sz := range sizes {
				ps := carve(src[off:], 5, sz...)
				for j, p := range ps {
					copy(p, value(uint64(i*100+j+replicas), len(p)))
				}
				off += len(concat(ps)) + 5*len(sz) + 1
				keys = append(keys, fmt.Sprintf("parts-%s-%d-%d", w.SegmentName(), replicas, i))
				parts = append(parts, ps)
			}
			for i, err := range w.BatchPutFromParts(ctx, keys, parts, &ReplicateConfig{Replicas: replicas}) {
				require.NoError(t, err, keys[i])
			}
			// Whole reads by every client see the concatenation.
			for i, k := range keys {
				want := concat(parts[i])
				for name, c := range map[string]*Client{"a": a, "b": b, "tcp": pure} {
					got, err := c.Get(ctx, k)
					require.NoError(t, err, "%s reads %s", name, k)
					require.True(t, bytes.Equal(want, got), "%s reads %s: bytes differ", name, k)
				}
			}
			// Reads into parts of another layout, with guards between them,
			// by every client (own segment: plain copies; others: engine).
			for name, c := range map[string]*Client{"a": a, "b": b, "tcp": pure} {
				dst := guarded(4 << 20)
				require.NoError(t, c.RegisterBuffer(dst))
				layouts := [][]int{
					{4164, 0},            // exact, then an empty part
					{1 << 20, 1 << 20},   // the value fills a prefix
					{3000, 9000, 345, 0}, // exact across three
				}
				var into [][][]byte
				off := 0
				for _, l := range layouts {
					ps := carve(dst[off:], 7, l...)
					off += len(concat(ps)) + 7*len(l) + 1
					into = append(into, ps)
				}
				ns, errs := c.BatchGetIntoParts(ctx, keys, into)
				var all [][]byte
				for i := range keys {
					require.NoError(t, errs[i], "%s reads %s", name, keys[i])
					want := concat(parts[i])
					require.Equal(t, len(want), ns[i])
					require.True(t, bytes.Equal(want, concat(into[i])[:ns[i]]), "%s reads %s into parts", name, keys[i])
					all = append(all, concat(into[i])[:0])
					// What the value did not reach stays untouched.
					rest := concat(into[i])[ns[i]:]
					require.True(t, bytes.Equal(guarded(len(rest)), rest), "bytes past the value were written")
				}
				for _, ps := range into {
					all = append(all, ps...)
				}
				guardsIntact(t, dst, all)
				require.NoError(t, c.UnregisterBuffer(dst))
			}
			require.NoError(t, w.UnregisterBuffer(src))
		}
	}

	// A value put whole reads into parts, and write-once holds for parts.
	whole := value(42, 70001)
	require.NoError(t, a.Put(ctx, "whole", whole, nil))
	dst := guarded(90000)
	require.NoError(t, b.RegisterBuffer(dst))
	into := carve(dst, 3, 1, 30000, 50000)
	ns, errs := b.BatchGetIntoParts(ctx, []string{"whole"}, [][][]byte{into})
	require.NoError(t, errs[0])
	assert.Equal(t, len(whole), ns[0])
	assert.True(t, bytes.Equal(whole, concat(into)[:len(whole)]))
	other := carve(dst, 0, 10)
	require.NoError(t, b.BatchPutFromParts(ctx, []string{"whole"}, [][][]byte{other}, nil)[0])
	got, err := a.Get(ctx, "whole")
	require.NoError(t, err)
	assert.True(t, bytes.Equal(whole, got), "write-once: the existing value stays")
}

func TestPartsBadInput(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	reg := make([]byte, 1<<20)
	copy(reg, value(3, len(reg)))
	require.NoError(t, b.RegisterBuffer(reg))
	loose := value(4, 1000) // Go memory nobody registered

	errs := b.BatchPutFromParts(ctx,
		[]string{"ok", "loose", "", "empty", "nil"},
		[][][]byte{{reg[:10], reg[100:200]}, {reg[:10], loose}, {reg[:1]}, {reg[:0], {}}, nil}, nil)
	require.NoError(t, errs[0])
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[1]))
	assert.Contains(t, errs[1].Error(), "part 1")
	assert.ErrorIs(t, errs[1], ErrNotRegistered)
	for _, err := range errs[2:] {
		assert.Equal(t, storepb.InvalidParams, codeOf(err), "%v", err)
	}
	ok, _ := a.BatchExist(ctx, []string{"ok", "loose"})
	assert.Equal(t, []bool{true, false}, ok)

	// Counts that differ fail every key.
	for _, err := range b.BatchPutFromParts(ctx, []string{"x", "y"}, [][][]byte{{reg[:1]}}, nil) {
		assert.Equal(t, storepb.InvalidParams, codeOf(err))
	}
	_, gerrs := b.BatchGetIntoParts(ctx, []string{"x", "y"}, [][][]byte{{reg[:1]}})
	for _, err := range gerrs {
		assert.Equal(t, storepb.InvalidParams, codeOf(err))
	}

	// Reads: unregistered part, missing key, empty key.
	dst := guarded(4096)
	require.NoError(t, b.RegisterBuffer(dst))
	loose2 := make([]byte, 100)
	ns, gerrs := b.BatchGetIntoParts(ctx, []string{"ok", "ok", "missing", ""},
		[][][]byte{{dst[:50], loose2}, {dst[:5], dst[10:200]}, {dst[300:400]}, {dst[500:600]}})
	assert.Equal(t, storepb.InvalidParams, codeOf(gerrs[0]))
	assert.ErrorIs(t, gerrs[0], ErrNotRegistered)
	assert.Equal(t, 0, ns[0])
	require.NoError(t, gerrs[1])
	assert.Equal(t, 110, ns[1])
	assert.Equal(t, storepb.ObjectNotFound, codeOf(gerrs[2]))
	assert.Equal(t, storepb.InvalidParams, codeOf(gerrs[3]))
	assert.Equal(t, concat([][]byte{reg[:10], reg[100:200]}), concat([][]byte{dst[:5], dst[10:115]}))
	assert.True(t, bytes.Equal(guarded(len(dst)-110), append(append([]byte{}, dst[5:10]...), dst[115:]...)), "bytes outside the parts were written")
}

func TestPartsTooSmall(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "big", value(8, 5000), nil))
	dst := guarded(8192)
	require.NoError(t, b.RegisterBuffer(dst))
	// 4999 bytes of parts for a value of 5000: refused, nothing read, not
	// even into the parts.
	parts := carve(dst, 16, 1000, 3000, 999)
	ns, errs := b.BatchGetIntoParts(ctx, []string{"big"}, [][][]byte{parts})
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]), "%v", errs[0])
	assert.Equal(t, 0, ns[0])
	assert.True(t, bytes.Equal(guarded(len(dst)), dst), "bytes were read into parts too small")
	// Also for a client whose segment holds the value (plain copies).
	adst := guarded(8192)
	require.NoError(t, a.RegisterBuffer(adst))
	_, errs = a.BatchGetIntoParts(ctx, []string{"big"}, [][][]byte{carve(adst, 1, 4999)})
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
	assert.True(t, bytes.Equal(guarded(len(adst)), adst), "bytes were read into parts too small")
}

func TestPartsChecksumCatchesCorruption(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	src := make([]byte, 1<<20)
	require.NoError(t, a.RegisterBuffer(src))
	parts := carve(src, 1, 200<<10, 3, 300<<10)
	for i, p := range parts {
		copy(p, value(uint64(50+i), len(p)))
	}
	want := concat(parts)
	require.NoError(t, a.BatchPutFromParts(ctx, []string{"c"}, [][][]byte{parts},
		&ReplicateConfig{PreferredSegments: []string{a.SegmentName()}})[0])
	// The checksum the master keeps is that of the whole value: a whole
	// read verifies it.
	got, err := b.Get(ctx, "c")
	require.NoError(t, err)
	require.Equal(t, want, got)

	reps, _, _, _, err := m.Service().GetReplicaList("c")
	require.NoError(t, err)
	mr := reps[0].GetMemory()
	require.Equal(t, a.SegmentName(), mr.SegmentName)
	// Flip a byte in the last part's range.
	a.segBuf.Bytes()[mr.BufferAddress-uint64(a.segBuf.Addr())+uint64(len(want))-10] ^= 0xff

	dst := make([]byte, 1<<20)
	require.NoError(t, b.RegisterBuffer(dst))
	into := carve(dst, 2, 100, 400<<10, 200<<10)
	_, errs := b.BatchGetIntoParts(ctx, []string{"c"}, [][][]byte{into})
	assert.Equal(t, storepb.ChecksumMismatch, codeOf(errs[0]), "%v", errs[0])
	// The writer's own segment (plain copies) checks too.
	adst := make([]byte, 1<<20)
	require.NoError(t, a.RegisterBuffer(adst))
	_, errs = a.BatchGetIntoParts(ctx, []string{"c"}, [][][]byte{carve(adst, 0, 7, len(want))})
	assert.Equal(t, storepb.ChecksumMismatch, codeOf(errs[0]), "%v", errs[0])
}

package client

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/master"
)

func overTCP(c *Config) { c.EngineConfig = engine.Config{Host: "127.0.0.1", Transport: "tcp"} }

// Values of engineSumMin and more are checksummed by the writes that carry
// them; the master must keep the same checksum as a pass over the value
// gives, on every path: registered memory, staged in several pieces,
// parts of both kinds, a batch mixing small values (summed by the caller,
// coalesced) with large ones, and a replica here beside one elsewhere.
func TestPutChecksumFromWrites(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	svc, addr := m.Service(), m.Addr()
	newClient(t, addr, 32<<20, overTCP)
	newClient(t, addr, 32<<20, overTCP)
	w := newClient(t, addr, 32<<20, overTCP)
	r := newClient(t, addr, NoSegment, overTCP)
	ctx := ctxT(t)

	check := func(key string, want []byte) {
		t.Helper()
		_, _, sum, n, err := svc.GetReplicaList(key)
		require.NoError(t, err, key)
		require.Equal(t, uint64(len(want)), n, key)
		assert.Equal(t, checksum(want), sum, "%s: the master's checksum", key)
		got, err := r.Get(ctx, key)
		require.NoError(t, err, key) // verified against that checksum
		assert.Equal(t, want, got, key)
	}

	// From registered memory, a batch of small values in a row (summed
	// here) and two large ones (summed by the writes).
	small, vals, mem := batch("s", 0, 16, 4096)
	big := make([]byte, 3*engineSumMin)
	copy(big, value(7, len(big)))
	mem = append(mem[:len(mem):len(mem)], big...)
	require.NoError(t, w.RegisterBuffer(mem))
	keys := append(small, "big0", "big1")
	vals = append(vals, mem[16*4096:16*4096+engineSumMin], mem[16*4096+engineSumMin:])
	far := &ReplicateConfig{Replicas: 2}
	for i, err := range w.BatchPut(ctx, keys, vals, far) {
		require.NoError(t, err, keys[i])
	}
	for i, k := range keys {
		check(k, vals[i])
	}

	// Unregistered: staged in pieces of the staging buffer's largest grant,
	// each summed by its write and folded into the value's checksum.
	staged := value(8, int(w.stage.max())*2+12345)
	require.NoError(t, w.Put(ctx, "staged", staged, far))
	check("staged", staged)

	// Parts: small and large, registered, some empty.
	pm := value(9, 4096+2*engineSumMin+100+engineSumMin)
	require.NoError(t, w.RegisterBuffer(pm))
	parts := [][]byte{pm[:4096], pm[4096 : 4096+2*engineSumMin], {}, pm[4096+2*engineSumMin : 4096+2*engineSumMin+100],
		pm[4096+2*engineSumMin+100:]}
	for _, err := range w.BatchPutFromParts(ctx, []string{"parts"}, [][][]byte{parts}, far) {
		require.NoError(t, err)
	}
	check("parts", slices.Concat(parts...))

	// Only a replica in this process: plain copies, summed by the caller.
	here := &ReplicateConfig{PreferredSegments: []string{w.name}}
	own := value(10, 2*engineSumMin)
	require.NoError(t, w.Put(ctx, "own", own, here))
	reps, _, _, _, err := svc.GetReplicaList("own")
	require.NoError(t, err)
	require.Equal(t, w.name, reps[0].GetMemory().GetSegmentName())
	check("own", own)
}

// A large value whose reserved slot the master no longer has is written
// again the usual way: its checksum, folded from the writes, is that of
// the second round alone.
func TestReservedPutSlotGoneLargeValue(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	svc, addr := m.Service(), m.Addr()
	newClient(t, addr, 32<<20, overTCP)
	w := newClient(t, addr, NoSegment, overTCP, reservePuts)
	ctx := ctxT(t)
	const size = 2 * engineSumMin
	require.NoError(t, w.Put(ctx, "a", value(1, size), nil))
	require.Eventually(t, func() bool { return w.slotsHeld(size) > 0 }, 5*time.Second, time.Millisecond)
	w.slots.mu.Lock()
	held := slices.Clone(w.slots.free[size])
	w.slots.mu.Unlock()
	for _, s := range held {
		require.NoError(t, svc.PutRevoke(ctx, w.id, "\x00\x00"+s.name))
	}
	b := value(2, size)
	require.NoError(t, w.Put(ctx, "b", b, nil))
	_, _, sum, _, err := svc.GetReplicaList("b")
	require.NoError(t, err)
	assert.Equal(t, nonZero(crc32c.Checksum(b)), sum)
	v, err := w.Get(ctx, "b")
	require.NoError(t, err)
	assert.Equal(t, b, v)
	assert.Zero(t, w.slots.used.Load(), "b's slot was gone")
}

package master

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// fakeClock is a settable clock for ServiceConfig.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestService(t *testing.T, cfg ServiceConfig) (*Service, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	cfg.Now = clk.Now
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	s, err := NewService(cfg)
	require.NoError(t, err)
	return s, clk
}

func seg(id string, base, size uint64) *storepb.Segment {
	return &storepb.Segment{Id: id, Name: "node-" + id, Base: base, Size: size,
		TransportEndpoint: "127.0.0.1:1" + id, Protocol: "tcp", HostId: "host-" + id}
}

func mem(r *storepb.Replica) *storepb.MemoryReplica { return r.GetMemory() }

// put is PutStart + PutEnd.
func put(t testing.TB, s *Service, client, key string, n uint64, cfg *storepb.ReplicateConfig) []*storepb.Replica {
	t.Helper()
	reps, err := s.PutStart(t.Context(), client, key, n, cfg)
	require.NoError(t, err)
	require.NoError(t, s.PutEnd(t.Context(), client, key, 7))
	return reps
}

func TestServiceConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   ServiceConfig
		field string // "" means valid
	}{
		// The zero config means every Mooncake default.
		{"zero", ServiceConfig{}, ""},
		{"negative lease", ServiceConfig{LeaseTTL: -1}, "LeaseTTL"},
		{"negative client ttl", ServiceConfig{ClientTTL: -1}, "ClientTTL"},
		{"watermark above one", ServiceConfig{EvictionHighWatermark: 1.5}, "EvictionHighWatermark"},
		{"negative ratio", ServiceConfig{EvictionRatio: -0.1}, "EvictionRatio"},
		{"negative shards", ServiceConfig{Shards: -1}, "Shards"},
		{"unknown strategy", ServiceConfig{Strategy: "best"}, "Strategy"},
		{"negative key limit", ServiceConfig{MaxKeyLen: -1}, "MaxKeyLen"},
		{"negative batch limit", ServiceConfig{MaxBatch: -1}, "MaxBatch"},
		{"negative watcher limit", ServiceConfig{MaxWatchers: -1}, "MaxWatchers"},
		// Every named strategy is accepted.
		{"local first", ServiceConfig{Strategy: StrategyLocalFirst}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field, "the error names the field")
			_, nerr := NewService(tc.cfg)
			assert.Equal(t, err, nerr, "NewService refuses it with Validate's error")
		})
	}
	s, err := NewService(ServiceConfig{})
	require.NoError(t, err)
	c := s.Config()
	assert.Equal(t, DefaultLeaseTTL, c.LeaseTTL)
	assert.Equal(t, 0.90, c.EvictionHighWatermark)
	assert.Equal(t, 1024, c.Shards)
	assert.Equal(t, StrategyRandom, c.Strategy)
	assert.Equal(t, MaxKeyLen, c.MaxKeyLen)
	assert.Equal(t, uint64(DefaultMaxValueLen), c.MaxValueLen)
	assert.Equal(t, DefaultMaxBatch, c.MaxBatch)
	assert.Equal(t, uint64(DefaultMaxBatchValueBytes), c.MaxBatchValueBytes)
	assert.Equal(t, DefaultMaxWatchers, c.MaxWatchers)
}

func TestPutGetRoundTrip(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 1<<40, 1<<20)))
	reps, err := s.PutStart(t.Context(), "c1", "k", 1000, nil)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	assert.Equal(t, storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING, reps[0].Status)

	// Not readable before PutEnd.
	_, _, _, _, err = s.GetReplicaList("k")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	ok, err := s.ExistKey("k")
	require.NoError(t, err)
	assert.False(t, ok)

	require.NoError(t, s.PutEnd(t.Context(), "c1", "k", 0xabc))
	got, ttl, sum, n, err := s.GetReplicaList("k")
	require.NoError(t, err)
	assert.Equal(t, DefaultLeaseTTL, ttl)
	assert.Equal(t, uint32(0xabc), sum)
	assert.Equal(t, uint64(1000), n)
	require.Len(t, got, 1)
	m := mem(got[0])
	assert.Equal(t, storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE, got[0].Status)
	assert.Equal(t, "node-1", m.SegmentName)
	assert.Equal(t, "127.0.0.1:11", m.TransportEndpoint)
	assert.Equal(t, uint64(1000), m.Size)
	assert.GreaterOrEqual(t, m.BufferAddress, uint64(1<<40))
	assert.LessOrEqual(t, m.BufferAddress+m.Size, uint64(1<<40+1<<20))
	assert.Equal(t, mem(reps[0]).BufferAddress, m.BufferAddress)

	st := s.Stats()
	assert.Equal(t, Stats{Capacity: 1 << 20, Used: 1024, Keys: 1, ValueBytes: 1000, Clients: 1, Segments: 1}, st)
}

func TestReplicasOnDistinctSegments(t *testing.T) {
	for _, strategy := range []string{StrategyRandom, StrategyFreeRatioFirst, StrategyLocalFirst} {
		t.Run(strategy, func(t *testing.T) {
			s, _ := newTestService(t, ServiceConfig{Strategy: strategy})
			for i := range 4 {
				id := fmt.Sprint(i)
				require.NoError(t, s.MountSegment(t.Context(), "c"+id, seg(id, uint64(i)<<32, 1<<20)))
			}
			for k := range 20 {
				reps := put(t, s, "c0", fmt.Sprint("k", k), 4096, &storepb.ReplicateConfig{ReplicaNum: 3})
				require.Len(t, reps, 3)
				names := map[string]bool{}
				for _, r := range reps {
					names[mem(r).SegmentName] = true
				}
				assert.Len(t, names, 3, "replicas share a segment")
			}
			// More replicas than segments is best effort: one per segment.
			reps := put(t, s, "c0", "many", 64, &storepb.ReplicateConfig{ReplicaNum: 9})
			assert.Len(t, reps, 4)
		})
	}
}

func TestPlacementPreferences(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	for i := range 4 {
		id := fmt.Sprint(i)
		require.NoError(t, s.MountSegment(t.Context(), "c"+id, seg(id, uint64(i)<<32, 1<<20)))
	}
	for k := range 10 {
		// A preferred segment, by name, is used first.
		reps := put(t, s, "c0", fmt.Sprint("p", k), 64, &storepb.ReplicateConfig{PreferredSegments: []string{"node-2"}})
		assert.Equal(t, "node-2", mem(reps[0]).SegmentName)
		// prefer_local places on the caller's host.
		reps = put(t, s, "c3", fmt.Sprint("l", k), 64, &storepb.ReplicateConfig{PreferLocal: true})
		assert.Equal(t, "node-3", mem(reps[0]).SegmentName)
	}
}

func TestFreeRatioFirst(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{Strategy: StrategyFreeRatioFirst})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("2", 1<<32, 1<<20)))
	put(t, s, "a", "big", 1<<19, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	for k := range 5 {
		reps := put(t, s, "a", fmt.Sprint("k", k), 1024, nil)
		assert.Equal(t, "node-2", mem(reps[0]).SegmentName)
	}
}

func TestWriteOnceAndUpsert(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 1<<20)))
	put(t, s, "c1", "k", 100, nil)

	// A second put of a complete key is refused.
	_, err := s.PutStart(t.Context(), "c1", "k", 100, nil)
	require.ErrorIs(t, err, storepb.ErrObjectAlreadyExists)

	// An upsert keeps the old value readable until its PutEnd.
	_, err = s.UpsertStart(t.Context(), "c1", "k", 300, nil)
	require.NoError(t, err)
	_, _, _, n, err := s.GetReplicaList("k")
	require.NoError(t, err)
	assert.Equal(t, uint64(100), n)
	// A second upsert while one is in flight is refused.
	_, err = s.UpsertStart(t.Context(), "c2", "k", 300, nil)
	require.ErrorIs(t, err, storepb.ErrObjectAlreadyExists)
	require.NoError(t, s.UpsertEnd(t.Context(), "c1", "k", 9))
	_, _, sum, n, err := s.GetReplicaList("k")
	require.NoError(t, err)
	assert.Equal(t, uint64(300), n)
	assert.Equal(t, uint32(9), sum)
	// The old value was leased by the reads above: its space is held until
	// the lease ends, then freed.
	assert.Equal(t, uint64(128+320), s.Stats().Used)
	clk.Advance(DefaultLeaseTTL + time.Second)
	s.Evict()
	assert.Equal(t, uint64(320), s.Stats().Used)

	// An unleased old value is freed at once.
	_, err = s.UpsertStart(t.Context(), "c1", "k", 64, nil)
	require.NoError(t, err)
	require.NoError(t, s.UpsertEnd(t.Context(), "c1", "k", 1))
	assert.Equal(t, uint64(64), s.Stats().Used)

	// Revoking an upsert keeps the old value.
	_, err = s.UpsertStart(t.Context(), "c1", "k", 640, nil)
	require.NoError(t, err)
	require.NoError(t, s.UpsertRevoke(t.Context(), "c1", "k"))
	_, _, _, n, err = s.GetReplicaList("k")
	require.NoError(t, err)
	assert.Equal(t, uint64(64), n)
	assert.Equal(t, uint64(64), s.Stats().Used)

	// Revoking a first put forgets the key and frees its space.
	_, err = s.PutStart(t.Context(), "c1", "new", 64, nil)
	require.NoError(t, err)
	require.NoError(t, s.PutRevoke(t.Context(), "c1", "new"))
	_, _, _, _, err = s.GetReplicaList("new")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	assert.Equal(t, uint64(64), s.Stats().Used)
}

func TestErrorCodes(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 1<<20)))
	_, err := s.PutStart(t.Context(), "c1", "inflight", 10, nil)
	require.NoError(t, err)
	long := strings.Repeat("k", MaxKeyLen+1)

	tests := []struct {
		name string
		call func() error
		want error
	}{
		// Keys must be non-empty and at most 4096 bytes.
		{"put empty key", func() error { _, err := s.PutStart(t.Context(), "c1", "", 10, nil); return err }, storepb.ErrInvalidParams},
		{"put oversized key", func() error { _, err := s.PutStart(t.Context(), "c1", long, 10, nil); return err }, storepb.ErrInvalidParams},
		{"get empty key", func() error { _, _, _, _, err := s.GetReplicaList(""); return err }, storepb.ErrInvalidParams},
		{"exist oversized key", func() error { _, err := s.ExistKey(long); return err }, storepb.ErrInvalidParams},
		{"remove empty key", func() error { return s.Remove(t.Context(), "", false) }, storepb.ErrInvalidParams},
		// A key of exactly 4096 bytes is fine.
		{"max key", func() error { _, err := s.PutStart(t.Context(), "c1", long[1:], 10, nil); return err }, nil},
		// Lengths must be positive; replica counts not negative.
		{"zero length", func() error { _, err := s.PutStart(t.Context(), "c1", "z", 0, nil); return err }, storepb.ErrInvalidParams},
		{"negative replicas", func() error {
			_, err := s.PutStart(t.Context(), "c1", "z", 1, &storepb.ReplicateConfig{ReplicaNum: -1})
			return err
		}, storepb.ErrInvalidParams},
		// Unknown keys.
		{"get unknown", func() error { _, _, _, _, err := s.GetReplicaList("nope"); return err }, storepb.ErrObjectNotFound},
		{"remove unknown", func() error { return s.Remove(t.Context(), "nope", true) }, storepb.ErrObjectNotFound},
		{"end unknown", func() error { return s.PutEnd(t.Context(), "c1", "nope", 0) }, storepb.ErrObjectNotFound},
		{"revoke unknown", func() error { return s.PutRevoke(t.Context(), "c1", "nope") }, storepb.ErrObjectNotFound},
		// Only the client that started a put may end or revoke it.
		{"end by other client", func() error { return s.PutEnd(t.Context(), "c2", "inflight", 0) }, storepb.ErrInvalidParams},
		{"revoke by other client", func() error { return s.PutRevoke(t.Context(), "c2", "inflight") }, storepb.ErrInvalidParams},
		// A put in flight is not readable and blocks another put.
		{"get in flight", func() error { _, _, _, _, err := s.GetReplicaList("inflight"); return err }, storepb.ErrObjectNotFound},
		{"put over in flight", func() error { _, err := s.PutStart(t.Context(), "c2", "inflight", 10, nil); return err }, storepb.ErrObjectAlreadyExists},
		// Segments: bad descriptors, another client's id, unknown ids.
		{"mount no id", func() error { return s.MountSegment(t.Context(), "c1", seg("", 0, 10)) }, storepb.ErrInvalidParams},
		{"mount no name", func() error { return s.MountSegment(t.Context(), "c1", &storepb.Segment{Id: "x", Size: 10}) }, storepb.ErrInvalidParams},
		{"mount zero size", func() error { return s.MountSegment(t.Context(), "c1", seg("x", 0, 0)) }, storepb.ErrInvalidParams},
		{"mount nil", func() error { return s.MountSegment(t.Context(), "c1", nil) }, storepb.ErrInvalidParams},
		{"mount no client", func() error { return s.MountSegment(t.Context(), "", seg("x", 0, 10)) }, storepb.ErrInvalidParams},
		{"mount by other client", func() error { return s.MountSegment(t.Context(), "c2", seg("1", 0, 1<<20)) }, storepb.ErrInvalidParams},
		{"mount again same client", func() error { return s.MountSegment(t.Context(), "c1", seg("1", 0, 1<<20)) }, nil},
		{"unmount unknown", func() error { return s.UnmountSegment(t.Context(), "c1", "zz") }, storepb.ErrSegmentNotFound},
		{"unmount by other client", func() error { return s.UnmountSegment(t.Context(), "c2", "1") }, storepb.ErrInvalidParams},
		// An object larger than every segment.
		{"too large", func() error { _, err := s.PutStart(t.Context(), "c1", "huge", 1<<21, nil); return err }, storepb.ErrNoAvailableHandle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestLease(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 1<<20)))
	for _, k := range []string{"a", "b", "c"} {
		put(t, s, "c1", k, 100, nil)
	}
	_, _, _, _, err := s.GetReplicaList("a")
	require.NoError(t, err)
	ok, err := s.ExistKey("b")
	require.NoError(t, err)
	require.True(t, ok)

	// Leased objects resist Remove and RemoveAll without force.
	require.ErrorIs(t, s.Remove(t.Context(), "a", false), storepb.ErrObjectHasLease)
	require.ErrorIs(t, s.Remove(t.Context(), "b", false), storepb.ErrObjectHasLease)
	assert.Equal(t, 1, s.RemoveAll(t.Context(), false)) // only c
	// Reads extend the lease.
	clk.Advance(DefaultLeaseTTL / 2)
	_, _, _, _, err = s.GetReplicaList("a")
	require.NoError(t, err)
	clk.Advance(DefaultLeaseTTL/2 + time.Millisecond)
	require.ErrorIs(t, s.Remove(t.Context(), "a", false), storepb.ErrObjectHasLease)
	// b's lease has expired.
	require.NoError(t, s.Remove(t.Context(), "b", false))
	// Force removes a leased object.
	require.NoError(t, s.Remove(t.Context(), "a", true))
	assert.Equal(t, Stats{Capacity: 1 << 20, Clients: 1, Segments: 1}, s.Stats())

	put(t, s, "c1", "d", 100, nil)
	_, _, _, _, err = s.GetReplicaList("d")
	require.NoError(t, err)
	assert.Equal(t, 1, s.RemoveAll(t.Context(), true))
}

func TestEviction(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 100*1024)))
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("2", 1<<32, 100*1024)))
	// Fill the pool (200 KiB) with 1 KiB objects, oldest first: a hard
	// pin, a soft pin and a leased object, then k0..k196.
	put(t, s, "c1", "hard", 1024, &storepb.ReplicateConfig{WithHardPin: true})
	put(t, s, "c1", "soft", 1024, &storepb.ReplicateConfig{WithSoftPin: true})
	put(t, s, "c1", "leased", 1024, nil)
	for i := range 197 {
		clk.Advance(time.Millisecond)
		put(t, s, "c1", fmt.Sprint("k", i), 1024, nil)
	}
	_, _, _, _, err := s.GetReplicaList("leased")
	require.NoError(t, err)
	require.Equal(t, uint64(200*1024), s.Stats().Used)

	// The pool is full: the put evicts, then succeeds.
	reps, err := s.PutStart(t.Context(), "c1", "next", 1024, nil)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	require.NoError(t, s.PutEnd(t.Context(), "c1", "next", 0))
	// From 100% used, eviction frees used-0.90+0.05 = 15% of capacity: the
	// 30 oldest objects that are neither pinned nor leased.
	assert.Equal(t, uint64(171*1024), s.Stats().Used)
	for _, k := range []string{"hard", "soft", "leased", "next", "k30", "k196"} {
		_, _, _, _, err := s.GetReplicaList(k)
		require.NoError(t, err, "%s was evicted", k)
	}
	for i := range 30 {
		_, _, _, _, err := s.GetReplicaList(fmt.Sprint("k", i))
		require.ErrorIs(t, err, storepb.ErrObjectNotFound, "k%d survived", i)
	}
	// Below the watermark, Evict does nothing.
	assert.Zero(t, s.Evict())
}

func TestEvictionNeverTakesPinnedOrLeased(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 10*1024)))
	put(t, s, "c1", "hard", 1024, &storepb.ReplicateConfig{WithHardPin: true})
	put(t, s, "c1", "leased", 1024, nil)
	_, err := s.PutStart(t.Context(), "c1", "inflight", 1024, nil)
	require.NoError(t, err)
	for i := range 7 {
		clk.Advance(time.Millisecond)
		put(t, s, "c1", fmt.Sprint("soft", i), 1024, &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: 60_000})
	}
	_, _, _, _, err = s.GetReplicaList("leased")
	require.NoError(t, err)

	// Only soft-pinned objects are evictable: pass 2 takes the oldest two
	// (15% of 10 KiB rounds up to two objects).
	_, err = s.PutStart(t.Context(), "c1", "x", 1024, nil)
	require.NoError(t, err)
	require.NoError(t, s.PutEnd(t.Context(), "c1", "x", 0))
	for _, k := range []string{"hard", "leased", "x", "soft2", "soft6"} {
		_, _, _, _, err := s.GetReplicaList(k)
		require.NoError(t, err, k)
	}
	for _, k := range []string{"soft0", "soft1"} {
		_, _, _, _, err := s.GetReplicaList(k)
		require.ErrorIs(t, err, storepb.ErrObjectNotFound, k)
	}

	// Left with hard-pinned, leased and in-flight objects, a put fails.
	require.NoError(t, s.Remove(t.Context(), "hard", true))
	for _, k := range []string{"x", "soft2", "soft3", "soft4", "soft5", "soft6"} {
		require.NoError(t, s.Remove(t.Context(), k, true))
	}
	// (The free space is [0,1K) and [3K,10K): fill both.)
	put(t, s, "c1", "hard2", 7*1024, &storepb.ReplicateConfig{WithHardPin: true})
	put(t, s, "c1", "hard3", 1024, &storepb.ReplicateConfig{WithHardPin: true})
	_, err = s.PutStart(t.Context(), "c1", "y", 1024, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	for _, k := range []string{"leased", "hard2"} {
		_, _, _, _, err := s.GetReplicaList(k)
		require.NoError(t, err, k)
	}
	// Once the lease ends, the object is evictable again.
	clk.Advance(DefaultLeaseTTL + time.Second)
	_, err = s.PutStart(t.Context(), "c1", "y", 1024, nil)
	require.NoError(t, err)
	_, _, _, _, err = s.GetReplicaList("leased")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	_, _, _, _, err = s.GetReplicaList("hard2")
	require.NoError(t, err)
}

func TestUnmountDropsReplicas(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("2", 1<<32, 1<<20)))
	put(t, s, "a", "both", 64, &storepb.ReplicateConfig{ReplicaNum: 2})
	put(t, s, "a", "only1", 64, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	_, err := s.PutStart(t.Context(), "a", "pending1", 64, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	require.NoError(t, err)

	require.NoError(t, s.UnmountSegment(t.Context(), "a", "1"))
	// An object with a replica elsewhere keeps only that one.
	reps, _, _, _, err := s.GetReplicaList("both")
	require.NoError(t, err)
	require.Len(t, reps, 1)
	assert.Equal(t, "node-2", mem(reps[0]).SegmentName)
	// Objects with no replica left are gone, puts in flight too.
	_, _, _, _, err = s.GetReplicaList("only1")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	require.ErrorIs(t, s.PutEnd(t.Context(), "a", "pending1", 0), storepb.ErrObjectNotFound)
	assert.Equal(t, Stats{Capacity: 1 << 20, Used: 64, Keys: 1, ValueBytes: 64, Clients: 2, Segments: 1}, s.Stats())
	// Unmount is not repeatable; the id may be mounted again.
	require.ErrorIs(t, s.UnmountSegment(t.Context(), "a", "1"), storepb.ErrSegmentNotFound)
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("1", 0, 1<<20)))
}

func TestClientExpiry(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("3", 2<<32, 1<<20)))
	require.NoError(t, s.MountSegment(t.Context(), "b", seg("2", 1<<32, 1<<20)))
	for i := range 50 {
		put(t, s, "b", fmt.Sprint("k", i), 64, &storepb.ReplicateConfig{ReplicaNum: 2})
	}

	// Within the TTL nobody expires; b keeps pinging, a does not.
	clk.Advance(6 * time.Second)
	assert.Zero(t, s.ExpireClients())
	_, st := s.Ping("b")
	assert.Equal(t, storepb.ClientStatus_CLIENT_STATUS_OK, st)
	clk.Advance(6 * time.Second)
	assert.Equal(t, 1, s.ExpireClients())

	// No replica on a's segments is ever returned again.
	for i := range 50 {
		reps, _, _, _, err := s.GetReplicaList(fmt.Sprint("k", i))
		if err != nil {
			require.ErrorIs(t, err, storepb.ErrObjectNotFound)
			continue
		}
		for _, r := range reps {
			assert.Equal(t, "node-2", mem(r).SegmentName)
		}
	}
	assert.Equal(t, 1, s.Stats().Segments)

	// The expired client is told to remount, and may.
	_, st = s.Ping("a")
	assert.Equal(t, storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT, st)
	segs := []*storepb.Segment{seg("1", 0, 1<<20), seg("3", 2<<32, 1<<20)}
	require.NoError(t, s.ReMountSegment(t.Context(), "a", segs, false))
	require.NoError(t, s.ReMountSegment(t.Context(), "a", segs, false)) // idempotent
	_, st = s.Ping("a")
	assert.Equal(t, storepb.ClientStatus_CLIENT_STATUS_OK, st)
	assert.Equal(t, 3, s.Stats().Segments)
	// A remount cannot take another client's segment.
	require.ErrorIs(t, s.ReMountSegment(t.Context(), "a", []*storepb.Segment{seg("2", 0, 10)}, false), storepb.ErrInvalidParams)
}

func TestZombiePutStart(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 0, 1<<20)))
	_, err := s.PutStart(t.Context(), "a", "k", 4096, nil)
	require.NoError(t, err)

	// Before the discard timeout the put in flight wins.
	clk.Advance(DefaultPutStartDiscardTimeout - time.Second)
	_, err = s.PutStart(t.Context(), "b", "k", 4096, nil)
	require.ErrorIs(t, err, storepb.ErrObjectAlreadyExists)
	// After it, another client pre-empts it; the old space is freed.
	clk.Advance(2 * time.Second)
	_, err = s.PutStart(t.Context(), "b", "k", 4096, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), s.Stats().Used)
	require.ErrorIs(t, s.PutEnd(t.Context(), "a", "k", 0), storepb.ErrInvalidParams)
	require.NoError(t, s.PutEnd(t.Context(), "b", "k", 0))

	// A put left in flight past the release timeout is reclaimed.
	_, err = s.PutStart(t.Context(), "a", "z", 4096, nil)
	require.NoError(t, err)
	assert.Zero(t, s.ReclaimPuts())
	clk.Advance(DefaultPutStartReleaseTimeout)
	assert.Equal(t, 1, s.ReclaimPuts())
	assert.Equal(t, uint64(4096), s.Stats().Used)
	require.ErrorIs(t, s.PutEnd(t.Context(), "a", "z", 0), storepb.ErrObjectNotFound)
}

// checkNoOverlap asserts that no two live replicas (complete or in flight)
// overlap in a segment, and that allocators account for exactly them.
func checkNoOverlap(t *testing.T, s *Service) {
	t.Helper()
	type span struct{ off, end uint64 }
	bySeg := map[*segment][]span{}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			reps := o.replicas
			if o.pending != nil {
				reps = append(reps[:len(reps):len(reps)], o.pending.replicas...)
			}
			for _, r := range reps {
				r.pieces(func(p replica) { bySeg[p.seg] = append(bySeg[p.seg], span{p.off, p.off + p.size}) })
			}
		}
		sh.mu.Unlock()
	}
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, d := range s.deferred {
		for _, r := range d.reps {
			r.pieces(func(p replica) {
				if !p.seg.dead.Load() {
					bySeg[p.seg] = append(bySeg[p.seg], span{p.off, p.off + p.size})
				}
			})
		}
	}
	for sg, spans := range bySeg {
		require.False(t, sg.dead.Load(), "replica on unmounted segment %s", sg.id)
		sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
		var used uint64
		for i, sp := range spans {
			require.LessOrEqual(t, sp.end, sg.size)
			if i > 0 {
				require.LessOrEqual(t, spans[i-1].end, sp.off, "overlap in segment %s", sg.id)
			}
			used += (sp.end - sp.off + 63) &^ 63
		}
		require.Equal(t, sg.alloc.Used(), used, "segment %s accounting", sg.id)
	}
}

func TestConcurrentPutsGets(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{Shards: 16})
	for i := range 4 {
		id := fmt.Sprint(i)
		require.NoError(t, s.MountSegment(t.Context(), "c"+id, seg(id, uint64(i)<<32, 256<<10)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	var wg sync.WaitGroup
	// Segment 3 comes and goes while the others put and get.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			assert.NoError(t, s.UnmountSegment(t.Context(), "c3", "3"))
			assert.NoError(t, s.MountSegment(t.Context(), "c3", seg("3", 3<<32, 256<<10)))
		}
	}()
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			client := fmt.Sprint("c", g%4)
			for range 500 {
				key := fmt.Sprint("k", rng.IntN(200))
				switch rng.IntN(6) {
				case 0, 1:
					n := uint64(1 + rng.IntN(8<<10))
					cfg := &storepb.ReplicateConfig{ReplicaNum: int32(1 + rng.IntN(3))}
					start := s.PutStart
					if rng.IntN(4) == 0 {
						start = s.UpsertStart
					}
					if _, err := start(t.Context(), client, key, n, cfg); err != nil {
						continue
					}
					end := func() error { return s.PutEnd(t.Context(), client, key, 1) }
					if rng.IntN(5) == 0 {
						end = func() error { return s.PutRevoke(t.Context(), client, key) }
					}
					// The put in flight may be gone: segment 3 went with
					// its only replica, or another goroutine of the same
					// client started the key again.
					if err := end(); err != nil {
						assert.ErrorIs(t, err, storepb.ErrObjectNotFound)
					}
				case 2, 3:
					reps, _, _, n, err := s.GetReplicaList(key)
					if err == nil {
						for _, r := range reps {
							assert.Equal(t, n, mem(r).Size)
						}
					}
				case 4:
					_ = s.Remove(t.Context(), key, rng.IntN(2) == 0)
				case 5:
					s.Evict()
					clk.Advance(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	require.NoError(t, <-done)
	checkNoOverlap(t, s)
	st := s.Stats()
	assert.LessOrEqual(t, st.Used, st.Capacity)
}

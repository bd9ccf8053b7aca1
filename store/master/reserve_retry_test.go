package master

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// gateJournal is a memJournal whose first wait blocks until release is
// closed (it says so on held); later waits return at once.
type gateJournal struct {
	memJournal
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (j *gateJournal) wait(ctx context.Context, seq uint64) error {
	first := false
	j.once.Do(func() { first = true })
	if first {
		close(j.held)
		<-j.release
	}
	return nil
}

// A retry of a reserve (same nonce) that arrives while the first call is
// still in its loop waits for it and answers every slot it made: none is
// left in flight that no answer names, holding pool space until the
// master reclaims it 10 minutes later.
func TestPutReserveRetryWaitsForFirst(t *testing.T) {
	const L = 64 << 10
	s, _ := newTestService(t, ServiceConfig{EvictionRatio: 1})
	j := &gateJournal{held: make(chan struct{}), release: make(chan struct{})}
	require.NoError(t, s.MountSegment(t.Context(), "n", seg("1", 1<<20, 4*L)))
	put(t, s, "other", "old0", L, nil) // evictable: the first call evicts
	put(t, s, "other", "old1", L, nil) // them for its slots 2 and 3
	s.j = j

	type answer struct {
		n   int
		err error
	}
	firstDone := make(chan answer, 1)
	go func() {
		sl, err := s.reserve(context.Background(), DefaultTenant, "a", "nonce1", L, 4, nil, false)
		firstDone <- answer{len(sl), err}
	}()
	<-j.held // the first call made slots 0 and 1 and waits in startEvicting

	retryDone := make(chan answer, 1)
	go func() {
		sl, err := s.reserve(context.Background(), DefaultTenant, "a", "nonce1", L, 4, nil, false)
		retryDone <- answer{len(sl), err}
	}()
	var retry answer
	select {
	case retry = <-retryDone:
		close(j.release)
	case <-time.After(5 * time.Second):
		// A fix that makes the retry wait for the first call: let it go.
		close(j.release)
		retry = <-retryDone
	}
	first := <-firstDone
	require.NoError(t, first.err)
	require.NoError(t, retry.err)
	held := s.reserved(DefaultTenant, "a", slotPrefix+"n/a/nonce1/", L, 0, 4)
	t.Logf("first answered %d, retry answered %d, slots in flight under the nonce %d", first.n, retry.n, len(held))
	assert.Equal(t, len(held), retry.n, "every slot in flight under the nonce is in the answer the client got")
}

// A reserve with a nonce asking for 2^32-1 slots (PutReserveRequest.count
// is a uint32) is bounded before its slots are looked up, not after 4
// billion names, a shard lock each.
func TestPutReserveNonceCountBounded(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "n", seg("1", 1<<20, 1<<20)))
	done := make(chan int, 1)
	go func() {
		sl, _ := s.reserve(context.Background(), DefaultTenant, "a", "big", 4096, int(^uint32(0)), nil, false)
		done <- len(sl)
	}()
	select {
	case n := <-done:
		assert.LessOrEqual(t, n, s.cfg.MaxBatch)
	case <-time.After(10 * time.Second):
		t.Fatal("a reserve of 2^32-1 slots with a nonce still runs after 10 s (bounded to max_batch_size, it takes microseconds)")
	}
}

// A bounded reserve (slots a client takes on its own) makes no more slots
// than 1/boundedShare of the DRAM pool holds; none where not one fits
// (InvalidParams), or before any segment is mounted (NoAvailableHandle);
// lengths and replica counts whose product overflows are refused, not a
// division by zero. A retry of its nonce answers every slot the first call
// made, even after the pool shrank.
func TestPutReserveBounded(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{MaxBatchValueBytes: 1 << 44})
	ctx := t.Context()
	_, err := s.reserve(ctx, DefaultTenant, "a", "n0", 4096, 8, nil, true)
	assert.ErrorIs(t, err, storepb.ErrNoAvailableHandle)

	require.NoError(t, s.MountSegment(ctx, "n1", seg("1", 1<<20, 16<<20)))
	require.NoError(t, s.MountSegment(ctx, "n2", seg("2", 1<<30, 16<<20)))
	sl, err := s.reserve(ctx, DefaultTenant, "a", "n1", 4096, 1024, nil, true)
	require.NoError(t, err)
	assert.Len(t, sl, (32<<20)/boundedShare/4096, "1/64 of 32 MiB")
	sl, err = s.reserve(ctx, DefaultTenant, "a", "n2", 4096, 1024, &storepb.ReplicateConfig{ReplicaNum: 2}, true)
	require.NoError(t, err)
	assert.Len(t, sl, (32<<20)/boundedShare/4096/2, "each slot takes two replicas")
	sl, err = s.reserve(ctx, DefaultTenant, "a", "n3", 4096, 1024, nil, false)
	require.NoError(t, err)
	assert.Len(t, sl, 1024, "unbounded")

	_, err = s.reserve(ctx, DefaultTenant, "a", "n4", 1<<20, 1, nil, true)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams, "1 MiB > 1/64 of 32 MiB")
	_, err = s.reserve(ctx, DefaultTenant, "a", "n5", 1<<44, 1, &storepb.ReplicateConfig{ReplicaNum: 1 << 20}, true)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams)

	// A retry after the pool shrank answers every slot its first call made.
	on1 := &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}}
	sl, err = s.reserve(ctx, DefaultTenant, "b", "n6", 4096, 1024, on1, true)
	require.NoError(t, err)
	require.Len(t, sl, (32<<20)/boundedShare/4096)
	require.NoError(t, s.UnmountSegment(ctx, "n2", "2"))
	again, err := s.reserve(ctx, DefaultTenant, "b", "n6", 4096, 1024, on1, true)
	require.NoError(t, err)
	assert.Len(t, again, len(sl), "the retry answers the first call's slots, not 1/64 of what is left")
}

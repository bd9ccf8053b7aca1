package conductor_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ReplicaHistogram counts the blocks by the prefill instances that hold
// them, the store left out, reusing the caller's slice.
func TestReplicaHistogram(t *testing.T) {
	s := newScheduler(t, testConfig(), "p0", "p1", "p2", "d0")
	assert.Equal(t, []int{0}, s.ReplicaHistogram(nil), "an empty index")

	s.BlockStored("p0", []uint64{1, 2, 3})
	s.BlockStored("p1", []uint64{1, 2})
	s.BlockStored("p2", []uint64{1})
	s.StoreAdded([]uint64{1, 9})
	// Block 9: the store only; 3: p0; 2: p0, p1; 1: all three (and the
	// store, which does not count).
	dst := make([]int, 8)
	for i := range dst {
		dst[i] = 42
	}
	h := s.ReplicaHistogram(dst)
	assert.Equal(t, []int{1, 1, 1, 1}, h)
	assert.Same(t, &dst[0], &h[0], "dst is reused")
	assert.Equal(t, 3, s.Replicas(1))

	// Instances leaving and evicting take their replicas with them.
	require.NoError(t, s.Remove("p2"))
	s.BlockRemoved("p0", []uint64{3})
	s.StoreEvicted([]uint64{9})
	assert.Equal(t, []int{0, 0, 2}, s.ReplicaHistogram(h))
}

// The histogram of TestScheduleHotPrefixReplicas' burst: the hot prefix
// pulled to every instance, each request's own blocks on one.
func TestReplicaHistogramHotPrefix(t *testing.T) {
	s := newScheduler(t, testConfig(), "p0", "p1", "p2", "p3", "d0")
	hot := span(1, 8)
	var h []int
	for i := range 5 {
		_, err := s.Schedule(0, req(fmt.Sprint("r", i), append(slices.Clone(hot), span(uint64(100*(i+1)), 8)...)))
		require.NoError(t, err)
		h = s.ReplicaHistogram(h)
		if i < 4 {
			// The i+1 instances that hold the prefix, one request each.
			want := make([]int, i+2)
			want[1] = 8 * (i + 1)
			want[i+1] += 8
			assert.Equal(t, want, h, "after request %d", i)
		}
	}
	assert.Equal(t, []int{0, 40, 0, 0, 8}, h, "the fifth reuses p1's copy")
}

package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Each attempt at a replica gets an equal share of what is left of the
// lease, so that a replica on a node cut off (which never answers) leaves
// the next one time to be read within the lease; the last attempt gets
// the rest. Before, the first attempt took the whole lease and a get
// failed with LEASE_EXPIRED with a healthy replica untried
// (internal/faults TestNodePartitioned).
func TestAttemptDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	reps := func(n int) []*storepb.MemoryReplica { return make([]*storepb.MemoryReplica, n) }
	two := &getItem{start: now.Add(-2 * time.Second), ttlMs: 10000, reps: reps(2)} // 8 s left
	three := &getItem{start: now, ttlMs: 9000, reps: reps(3)}                      // 9 s left
	noLease := &getItem{start: now, reps: reps(2)}

	require.Equal(t, now.Add(4*time.Second), attemptDeadline([]*getItem{two}, 0, now), "half of 8 s")
	require.Equal(t, now.Add(8*time.Second), attemptDeadline([]*getItem{two}, 1, now), "the last replica gets the rest")
	require.Equal(t, now.Add(3*time.Second), attemptDeadline([]*getItem{three}, 0, now), "a third of 9 s")
	require.Equal(t, now.Add(3*time.Second), attemptDeadline([]*getItem{two, three, noLease}, 0, now), "the earliest of the round")
	require.True(t, attemptDeadline([]*getItem{noLease}, 0, now).IsZero(), "no lease, no deadline")
	expired := &getItem{start: now.Add(-time.Minute), ttlMs: 1000, reps: reps(2)}
	require.Equal(t, now.Add(-59*time.Second), attemptDeadline([]*getItem{expired}, 0, now), "past the lease: its end")
}

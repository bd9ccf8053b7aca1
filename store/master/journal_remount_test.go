package master

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A client the master expired comes back and mounts its segment again,
// same id (a long pause: the master asks it to remount). The objects the
// expiry took from that segment stay gone in a replay of the journal too:
// a restarted master or a new leader must not find them again in the
// segment, where newer objects may have their space.
func TestReplayAfterExpiryAndRemount(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	put(t, s, "a", "before", 4096, nil)
	clock.Advance(s.cfg.ClientTTL + time.Second)
	require.Equal(t, 1, s.ExpireClients())
	ok, err := s.ExistKey("before")
	require.NoError(t, err)
	require.False(t, ok, "the expiry took the object with its segment")

	require.NoError(t, s.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}))
	put(t, s, "a", "after", 4096, nil) // the space before had
	want := view(s)

	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st), "the journal restores")
	assert.Equal(t, want, view(s2))
}

package master

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A drain's move of an object with two replicas takes only the drained
// one off: the journal says so, and a new leader (or a restart) that
// replays it keeps the other replica too, as the leader did.
func TestDrainMoveJournalKeepsOtherReplicas(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	for _, c := range []string{"1", "2", "3"} {
		require.NoError(t, s.MountSegment(ctx, "c"+c, seg(c, uint64(c[0]-'0')<<24, 1<<20)))
	}
	reps := put(t, s, "c1", "k", 4096, &storepb.ReplicateConfig{ReplicaNum: 2})
	require.Len(t, reps, 2)
	drained := reps[0].GetMemory().SegmentName
	_, err := s.startDrain(t.Context(), []string{drained}, nil, 0)
	require.NoError(t, err)
	owner := "c" + drained[len("node-"):]
	tasks := s.takeTasks(t.Context(), owner)
	require.Len(t, tasks, 1, "the drain's move")
	require.NoError(t, s.MoveEnd(ctx, owner, tasks[0].Id, true))
	got, _, _, _, err := s.GetReplicaList("k")
	require.NoError(t, err)
	require.Len(t, got, 2, "the leader keeps the other replica")
	want := view(s)

	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st))
	assert.Equal(t, want, view(s2))
}

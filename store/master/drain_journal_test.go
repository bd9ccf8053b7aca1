package master

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// drainFixture is a journaled Service with segments node-1 (client c1, to
// drain, holding n objects of 4 KiB) and node-2 (client c2), and the job
// draining node-1 one unit at a time.
func drainFixture(t *testing.T, n int) (s *Service, j *memJournal, id string, clk *fakeClock) {
	t.Helper()
	s, clk = newTestService(t, ServiceConfig{})
	j = &memJournal{}
	s.j = j
	for _, c := range []string{"1", "2"} {
		require.NoError(t, s.MountSegment(t.Context(), "c"+c, seg(c, uint64(c[0]-'0')<<24, 1<<20)))
	}
	for i := range n {
		put(t, s, "c1", fmt.Sprint("k", i), 4096, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	}
	id, err := s.startDrain(t.Context(), []string{"node-1"}, nil, 1)
	require.NoError(t, err)
	return s, j, id, clk
}

// moveOne plans the jobs' units (the monitor's tick), hands out c1's move
// of one and ends it as the node reports.
func moveOne(t *testing.T, s *Service, ok bool) {
	t.Helper()
	s.stepDrains()
	tasks := s.takeTasks(t.Context(), "c1")
	require.Len(t, tasks, 1, "the job's one unit in flight")
	require.NoError(t, s.MoveEnd(t.Context(), "c1", tasks[0].Id, ok))
}

func jobOf(t *testing.T, s *Service, id string) *drainView {
	t.Helper()
	v := s.drainJobView(id)
	require.NotNil(t, v, "job %s unknown", id)
	return v
}

func segStatus(t *testing.T, s *Service, name string) string {
	t.Helper()
	st, ok := s.segmentStatus(name)
	require.True(t, ok)
	return segStatusNames[st]
}

// A drain job outlives its leader: the records say what it is and how far
// it got, and the Service that replays them goes on with it (its segment
// DRAINING, its counts kept) to the end, as the first would have.
func TestDrainJobResumedFromTheJournal(t *testing.T) {
	s, j, id, _ := drainFixture(t, 4)
	moveOne(t, s, true)
	moveOne(t, s, true)
	v := jobOf(t, s, id)
	require.Equal(t, "RUNNING", v.StatusName)
	require.Equal(t, 2, v.Succeeded)

	s2, _ := replayed(t, j.recs)
	got := jobOf(t, s2, id)
	assert.Equal(t, "RUNNING", got.StatusName)
	assert.Equal(t, 2, got.Succeeded, "the units moved before the failover")
	assert.Equal(t, uint64(2*4096), got.MigratedByte)
	assert.Equal(t, v.CreatedAt, got.CreatedAt)
	assert.Equal(t, []string{"node-1"}, got.Segments)
	assert.Equal(t, "DRAINING", segStatus(t, s2, "node-1"), "a resumed job's segment takes no new replicas")
	pr, err := s2.PutStart(t.Context(), "c1", "new", 4096, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	require.NoError(t, err)
	assert.Equal(t, "node-2", mem(pr[0]).SegmentName, "a put asking for a DRAINING segment goes elsewhere")
	moved := 0
	for i := range 4 {
		reps, _, _, _, err := s2.GetReplicaList(fmt.Sprint("k", i))
		require.NoError(t, err)
		if mem(reps[0]).SegmentName == "node-2" {
			moved++
		}
	}
	assert.Equal(t, 2, moved, "the objects moved before the failover")

	// The new leader finishes it.
	moveOne(t, s2, true)
	moveOne(t, s2, true)
	done := jobOf(t, s2, id)
	assert.Equal(t, "SUCCEEDED", done.StatusName)
	assert.Equal(t, 4, done.Succeeded)
	assert.Equal(t, uint64(4*4096), done.MigratedByte)
	assert.Equal(t, "DRAINED", segStatus(t, s2, "node-1"))
	for i := range 4 {
		reps, _, _, _, err := s2.GetReplicaList(fmt.Sprint("k", i))
		require.NoError(t, err)
		require.Len(t, reps, 1)
		assert.Equal(t, "node-2", mem(reps[0]).SegmentName)
	}
	pr, err = s2.PutStart(t.Context(), "c2", "after", 4096, nil)
	require.NoError(t, err)
	assert.Equal(t, "node-2", mem(pr[0]).SegmentName, "a drained segment takes nothing")
}

// Jobs that ended replay as they ended: a cancelled one's segment takes
// replicas again, a finished one's stays DRAINED; a job that failed keeps
// its failed units.
func TestDrainJobEndsReplayed(t *testing.T) {
	s, j, canceled, _ := drainFixture(t, 2)
	status, err := s.cancelDrain(t.Context(), canceled)
	require.NoError(t, err)
	require.Equal(t, "CANCELED", status)
	moveOne(t, s, false) // the cancelled job's move in flight ends
	failed, err := s.startDrain(t.Context(), []string{"node-1"}, nil, 1)
	require.NoError(t, err)
	for range 2 * drainTries {
		moveOne(t, s, false) // each unit, the node failing every copy
	}
	v := jobOf(t, s, failed)
	require.Equal(t, "FAILED", v.StatusName)
	require.Equal(t, 2, v.Failed)
	require.Equal(t, "OK", segStatus(t, s, "node-1"))

	s2, _ := replayed(t, j.recs)
	assert.Equal(t, "CANCELED", jobOf(t, s2, canceled).StatusName)
	got := jobOf(t, s2, failed)
	assert.Equal(t, "FAILED", got.StatusName)
	assert.Equal(t, 2, got.Failed)
	assert.Equal(t, "Drain job failed: unrecoverable units remain", got.Message)
	assert.Equal(t, "OK", segStatus(t, s2, "node-1"))

	j2 := &memJournal{} // the new leader's records, after the first's
	s2.j = j2
	ok, err := s2.startDrain(t.Context(), []string{"node-1"}, nil, 1)
	require.NoError(t, err)
	moveOne(t, s2, true)
	moveOne(t, s2, true)
	require.Equal(t, "SUCCEEDED", jobOf(t, s2, ok).StatusName)
	s3, _ := replayed(t, append(j.recs, j2.recs...))
	assert.Equal(t, "SUCCEEDED", jobOf(t, s3, ok).StatusName)
	assert.Equal(t, "DRAINED", segStatus(t, s3, "node-1"))
}

// A snapshot carries the jobs: a Service loaded from one (and the records
// after it) resumes them as from the whole log.
func TestDrainJobInSnapshot(t *testing.T) {
	s, j, id, _ := drainFixture(t, 3)
	moveOne(t, s, true)
	chunks, seq := s.snapshot(2)
	assert.Len(t, chunks[0].Drains, 1, "the first chunk holds the jobs")
	moveOne(t, s, true)
	s2 := restoredAfter(t, chunks, j.recs[seq:])
	got := jobOf(t, s2, id)
	assert.Equal(t, "RUNNING", got.StatusName)
	assert.Equal(t, 2, got.Succeeded)
	assert.Equal(t, "DRAINING", segStatus(t, s2, "node-1"))
	moveOne(t, s2, true)
	assert.Equal(t, "SUCCEEDED", jobOf(t, s2, id).StatusName)
}

// A Service keeps the latest keepEndedDrains jobs that ended (a running
// one always), so the jobs in its memory, records and snapshots stay
// bounded however many an operator runs.
func TestEndedDrainsBounded(t *testing.T) {
	s, j, running, clk := drainFixture(t, 1)
	require.NoError(t, s.MountSegment(t.Context(), "c3", seg("3", 3<<24, 1<<20)))
	var ids []string
	for i := range keepEndedDrains + 5 {
		if i%2 == 1 {
			// Jobs that end in the same millisecond: the one that just
			// ended is kept all the same.
			clk.Advance(time.Millisecond)
		}
		id, err := s.startDrain(t.Context(), []string{"node-3"}, nil, 0) // empty: it ends at once
		require.NoError(t, err)
		require.Equal(t, "SUCCEEDED", jobOf(t, s, id).StatusName)
		ids = append(ids, id)
	}
	s.drains.mu.Lock()
	n := len(s.drains.jobs)
	s.drains.mu.Unlock()
	assert.Equal(t, keepEndedDrains+1, n)
	assert.NotNil(t, s.drainJobView(ids[len(ids)-1]), "the latest kept")
	assert.NotNil(t, s.drainJobView(running), "a running job kept")

	s2, _ := replayed(t, j.recs)
	s2.drains.mu.Lock()
	n2 := len(s2.drains.jobs)
	s2.drains.mu.Unlock()
	assert.Equal(t, keepEndedDrains+1, n2)
	assert.NotNil(t, s2.drainJobView(ids[len(ids)-1]))
	assert.Equal(t, "RUNNING", jobOf(t, s2, running).StatusName)
}

// A segment's drain status replays as the leader set it, job by job in
// the order of their records: a drained segment mounted again (same id or
// a new one, same name) takes replicas again; a job started on it then
// cancelled leaves it so. The states ride in snapshots too.
func TestDrainStatesReplayed(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   string // the segment mounted again under node-1's name
	}{{"same id", "1"}, {"new id", "9"}} {
		t.Run(tc.name, func(t *testing.T) {
			s, j, id, _ := drainFixture(t, 1)
			moveOne(t, s, true)
			require.Equal(t, "SUCCEEDED", jobOf(t, s, id).StatusName)
			require.Equal(t, "DRAINED", segStatus(t, s, "node-1"))
			s2, _ := replayed(t, j.recs)
			assert.Equal(t, "DRAINED", segStatus(t, s2, "node-1"))

			require.NoError(t, s.UnmountSegment(t.Context(), "c1", "1"))
			again := seg("1", 1<<24, 1<<20)
			again.Id = tc.id
			require.NoError(t, s.MountSegment(t.Context(), "c1", again))
			require.Equal(t, "OK", segStatus(t, s, "node-1"))
			s3, _ := replayed(t, j.recs)
			assert.Equal(t, "OK", segStatus(t, s3, "node-1"), "mounted again after its drain")

			put(t, s, "c1", "k-again", 4096, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
			b, err := s.startDrain(t.Context(), []string{"node-1"}, nil, 1)
			require.NoError(t, err)
			require.Equal(t, "DRAINING", segStatus(t, s, "node-1"))
			s4, _ := replayed(t, j.recs)
			assert.Equal(t, "DRAINING", segStatus(t, s4, "node-1"))
			status, err := s.cancelDrain(t.Context(), b)
			require.NoError(t, err)
			require.Equal(t, "CANCELED", status)
			require.Equal(t, "OK", segStatus(t, s, "node-1"))
			for range 20 { // the jobs' records, not their order in a map
				s5, _ := replayed(t, j.recs)
				require.Equal(t, "OK", segStatus(t, s5, "node-1"))
			}

			// A snapshot holds the states: node-2 DRAINED by a third job.
			c, err := s.startDrain(t.Context(), []string{"node-2"}, nil, 0)
			require.NoError(t, err)
			s.stepDrains()
			require.NoError(t, s.MoveEnd(t.Context(), "c2", s.takeTasks(t.Context(), "c2")[0].Id, true))
			require.Equal(t, "SUCCEEDED", jobOf(t, s, c).StatusName)
			chunks, seq := s.snapshot(1000)
			s6 := restoredAfter(t, chunks, j.recs[seq:])
			assert.Equal(t, "DRAINED", segStatus(t, s6, "node-2"))
			assert.Equal(t, "OK", segStatus(t, s6, "node-1"))
		})
	}
}

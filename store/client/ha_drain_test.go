package client

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/master"
)

// startHAAdminPair is startHAPair with an admin HTTP server on each
// master, where drain jobs are posted and queried.
func startHAAdminPair(t *testing.T, every int) (etcd string, leader, standby *master.Server) {
	t.Helper()
	etcd = etcdtest.Start(t)
	start := func() *master.Server {
		s, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
			HA: &master.HAConfig{Etcd: []string{etcd}, ClusterID: "t", LeaderTTL: 3 * time.Second, SnapshotEvery: every}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	m1, m2 := start(), start()
	if leader = waitLeader(t, m1, m2); leader == m1 {
		return etcd, m1, m2
	}
	return etcd, m2, m1
}

// A drain job survives a failover: the new leader knows the job the old
// one created (same job_id), keeps its segment DRAINING, goes on handing
// out its moves, and ends it SUCCEEDED with every unit and byte counted,
// those moved before the failover too. The segment is then DRAINED and
// holds no replica, and every object reads back byte-exact.
func TestDrainJobSurvivesFailover(t *testing.T) {
	testDrainFailover(t, 100000, false)
}

// As TestDrainJobSurvivesFailover, with a small SnapshotEvery: the new
// leader loads the job from a snapshot written after the job started, plus
// the log after it (moves that ended after that snapshot).
func TestDrainJobSurvivesFailoverFromSnapshot(t *testing.T) {
	testDrainFailover(t, 4, true)
}

func testDrainFailover(t *testing.T, every int, fromSnapshot bool) {
	etcd, leader, standby := startHAAdminPair(t, every)
	haCfg := func(c *Config) { c.Master = "etcd://" + etcd; c.ClusterID = "t" }
	// Without put slots, which a drain counts as units too (puts in
	// flight): the job's units are exactly the objects on a.
	noSlots := func(c *Config) { c.NoAutoSlots = true }
	a := newClient(t, "", 16<<20, haCfg, noSlots)
	b := newClient(t, "", 16<<20, haCfg, noSlots)
	// ctxT's 30 s would run out: the drain takes about a second per unit,
	// and the wait for it after the failover is up to 60 s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A few dozen objects, one in three placed on a's segment, the others
	// on b's; sizes not multiples of any allocation unit.
	const n = 36
	onA := &ReplicateConfig{PreferredSegments: []string{a.SegmentName()}}
	onB := &ReplicateConfig{PreferredSegments: []string{b.SegmentName()}}
	keys := make([]string, n)
	want := map[string][]byte{}
	for i := range n {
		keys[i] = fmt.Sprintf("d%d", i)
		want[keys[i]] = value(uint64(i), 3000+977*i)
		rc := onB
		if i%3 == 0 {
			rc = onA
		}
		require.NoError(t, a.Put(ctx, keys[i], want[keys[i]], rc), keys[i])
	}
	// The drain's units: the objects with a replica on a, and their bytes.
	onSeg := func(key string) (bool, error) {
		reps, errs := b.BatchReplicas(ctx, []string{key})
		if errs[0] != nil {
			return false, errs[0]
		}
		for _, r := range reps[0] {
			if r.GetMemory().GetSegmentName() == a.SegmentName() {
				return true, nil
			}
			for _, p := range r.GetMemory().GetStripes() {
				if p.GetSegmentName() == a.SegmentName() {
					return true, nil
				}
			}
		}
		return false, nil
	}
	units, bytesOnA := 0, 0
	for _, k := range keys {
		on, err := onSeg(k)
		require.NoError(t, err, k)
		if on {
			units++
			bytesOnA += len(want[k])
		}
	}
	require.Equal(t, n/3, units, "the objects placed on a")

	base := "http://" + leader.AdminAddr()
	snap0 := leader.SnapshotSeq()
	// Concurrency 1: one move in flight, handed out in a's ping answers
	// (every second), so the job runs for about a dozen seconds.
	code, ans := adminJSON(t, "POST", base+"/api/v1/drain_jobs",
		fmt.Sprintf(`{"segments":[%q],"max_concurrency":1}`, a.SegmentName()))
	require.Equal(t, 200, code, ans)
	require.Equal(t, "CREATED", ans["status"], ans)
	id := ans["job_id"].(string)
	query := func(base string) (int, map[string]any) {
		return adminJSON(t, "GET", base+"/api/v1/drain_jobs/query?job_id="+id, "")
	}
	segStatus := func(base string) string {
		code, st := adminJSON(t, "GET", base+"/api/v1/segments/status?segment="+a.SegmentName(), "")
		require.Equal(t, 200, code, st)
		return fmt.Sprint(st["status_name"])
	}
	code, job := query(base)
	require.Equal(t, 200, code, job)
	require.Contains(t, []any{"CREATED", "RUNNING"}, job["status_name"], job)
	require.Equal(t, "DRAINING", segStatus(base))

	// Fail over mid-job: some units moved by the old leader, some left
	// for the new one. From a snapshot: one written after the job started
	// (the second seen after the POST: the first may have been under way
	// before it), and a unit moved after it, in the log the new leader
	// loads after the snapshot.
	var snap uint64
	seenAt := -1.0
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, job = query(base)
		require.Equal(t, 200, code, job)
		require.Equal(t, "RUNNING", job["status_name"], "the job ended before the failover: %v", job)
		done := job["succeeded_units"].(float64)
		require.Less(t, done, float64(units), job)
		ready := done >= 1
		if fromSnapshot {
			if s := leader.SnapshotSeq(); s > snap0 && snap == 0 {
				snap = s
			} else if snap != 0 && s > snap && seenAt < 0 {
				seenAt, snap = done, s
			}
			ready = seenAt >= 0 && done > seenAt
		}
		if ready {
			break
		}
		require.True(t, time.Now().Before(deadline), "no unit moved (or no snapshot written) in 30 s: %v", job)
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("failing over with %v of %d units moved (snapshot %d): %v", job["succeeded_units"], units, snap, job)
	require.NoError(t, leader.Close())
	require.Same(t, standby, waitLeader(t, standby))
	base = "http://" + standby.AdminAddr()

	// The new leader knows the job, and the segment still drains (or has
	// drained, if the job already ended).
	code, job = query(base)
	require.Equal(t, 200, code, "the new leader does not know the job: %v", job)
	assert.Equal(t, id, job["job_id"])
	assert.Equal(t, []any{a.SegmentName()}, job["segments"])
	require.Contains(t, []any{"RUNNING", "SUCCEEDED"}, job["status_name"], job)
	require.Contains(t, []string{"DRAINING", "DRAINED"}, segStatus(base))

	deadline = time.Now().Add(60 * time.Second)
	for job["status_name"] == "RUNNING" {
		require.True(t, time.Now().Before(deadline), "the job still runs 60 s after the failover: %v", job)
		time.Sleep(200 * time.Millisecond)
		code, job = query(base)
		require.Equal(t, 200, code, job)
	}
	assert.Equal(t, map[string]any{"status_name": "SUCCEEDED", "succeeded_units": float64(units),
		"failed_units": 0.0, "blocked_units": 0.0, "active_units": 0.0, "migrated_bytes": float64(bytesOnA),
		"message": "Drain job finished successfully"},
		map[string]any{"status_name": job["status_name"], "succeeded_units": job["succeeded_units"],
			"failed_units": job["failed_units"], "blocked_units": job["blocked_units"],
			"active_units": job["active_units"], "migrated_bytes": job["migrated_bytes"], "message": job["message"]})
	assert.Equal(t, "DRAINED", segStatus(base))

	// Nothing is left on a, nothing is lost, and the drained segment takes
	// no new replica, even one asked for there.
	for _, k := range keys {
		on, err := onSeg(k)
		require.NoError(t, err, k)
		assert.False(t, on, "%s still has a replica on the drained segment", k)
	}
	for _, c := range []*Client{a, b} {
		vals, errs := c.BatchGet(ctx, keys)
		for i, k := range keys {
			require.NoError(t, errs[i], k)
			assert.True(t, bytes.Equal(want[k], vals[i]), k)
		}
	}
	require.NoError(t, a.Put(ctx, "late", value(99, 5000), onA))
	on, err := onSeg("late")
	require.NoError(t, err)
	assert.False(t, on, "a put landed on the drained segment")
}

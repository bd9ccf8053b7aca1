package client

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
)

// adminHTTP asks masters' admin servers in tests; a master that hangs
// fails the call, not the package's timeout.
var adminHTTP = &http.Client{Timeout: 30 * time.Second}

// adminJSON asks the master's admin server and decodes its JSON answer.
func adminJSON(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := adminHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// endpointOf is where /query_key says key's one replica is.
func endpointOf(t *testing.T, base, key string) string {
	t.Helper()
	code, ans := adminJSON(t, "GET", base+"/query_key?key="+key, "")
	require.Equal(t, 200, code, ans)
	data := ans["data"].([]any)
	require.Len(t, data, 1)
	return data[0].(map[string]any)["transport_endpoint_"].(string)
}

// waitJob polls a drain job until its status is not RUNNING (or CREATED).
func waitJob(t *testing.T, base, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, ans := adminJSON(t, "GET", base+"/api/v1/drain_jobs/query?job_id="+id, "")
		require.Equal(t, 200, code, ans)
		if s := ans["status_name"]; s != "RUNNING" && s != "CREATED" {
			return ans
		}
		require.True(t, time.Now().Before(deadline), "the drain job still runs: %v", ans)
		time.Sleep(20 * time.Millisecond)
	}
}

// A drain job (POST /api/v1/drain_jobs) moves every object off a node's
// segment through that node's own copies: the segment takes no new puts
// while DRAINING, the job ends SUCCEEDED with every unit and byte counted,
// the segment is DRAINED and empty, and the objects are read from the
// other node, also once the drained node is gone.
func TestDrainJob(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	a := newClient(t, m.Addr(), 8<<20)
	b := newClient(t, m.Addr(), 8<<20)
	r := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	base := "http://" + m.AdminAddr()

	onA := &ReplicateConfig{PreferredSegments: []string{a.SegmentName()}}
	want := map[string][]byte{}
	var total float64
	for i := range 6 {
		key := fmt.Sprintf("key%d", i)
		want[key] = value(uint64(i), 4096*(i+1))
		require.NoError(t, a.Put(ctx, key, want[key], onA))
		total += float64(len(want[key]))
	}
	aEnd := endpointOf(t, base, "key0")

	code, ans := adminJSON(t, "POST", base+"/api/v1/drain_jobs",
		fmt.Sprintf(`{"segments":[%q],"target_segments":[%q],"max_concurrency":2}`, a.SegmentName(), b.SegmentName()))
	require.Equal(t, 200, code, ans)
	assert.Equal(t, "CREATED", ans["status"])
	id := ans["job_id"].(string)

	// Draining, a takes no new replica, even one asked for there.
	_, st := adminJSON(t, "GET", base+"/api/v1/segments/status?segment="+a.SegmentName(), "")
	assert.Equal(t, "DRAINING", st["status_name"])
	require.NoError(t, a.Put(ctx, "late", value(9, 100), onA))
	assert.NotEqual(t, aEnd, endpointOf(t, base, "late"))

	job := waitJob(t, base, id)
	assert.Equal(t, map[string]any{"status_name": "SUCCEEDED", "type_name": "DRAIN", "succeeded_units": 6.0,
		"failed_units": 0.0, "blocked_units": 0.0, "active_units": 0.0, "migrated_bytes": total,
		"message": "Drain job finished successfully", "segments": []any{a.SegmentName()}},
		map[string]any{"status_name": job["status_name"], "type_name": job["type_name"],
			"succeeded_units": job["succeeded_units"], "failed_units": job["failed_units"],
			"blocked_units": job["blocked_units"], "active_units": job["active_units"],
			"migrated_bytes": job["migrated_bytes"], "message": job["message"], "segments": job["segments"]})
	_, st = adminJSON(t, "GET", base+"/api/v1/segments/status?segment="+a.SegmentName(), "")
	assert.Equal(t, 3.0, st["status"])
	assert.Equal(t, "DRAINED", st["status_name"])
	_, seg := httpGet(t, base+"/query_segment?segment="+a.SegmentName())
	assert.Contains(t, seg, "\nUsed(bytes): 0\n", "the drained segment holds nothing")

	for key, v := range want {
		assert.NotEqual(t, aEnd, endpointOf(t, base, key), key)
		got, err := r.Get(ctx, key)
		require.NoError(t, err, key)
		assert.Equal(t, v, got, key)
	}
	// The drained node goes: nothing is lost.
	require.NoError(t, a.Close())
	for key, v := range want {
		got, err := r.Get(ctx, key)
		require.NoError(t, err, key)
		assert.Equal(t, v, got, key)
	}
}

// A drain with nowhere to move to keeps its units blocked, as Mooncake's
// does; cancelled, the job is CANCELED and the segment takes puts again.
func TestDrainJobBlockedThenCanceled(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	// Without the slots its puts would reserve, which a drain counts
	// as units too (puts in flight).
	a := newClient(t, m.Addr(), 8<<20, func(c *Config) { c.NoAutoSlots = true })
	ctx := ctxT(t)
	base := "http://" + m.AdminAddr()
	for i := range 3 {
		require.NoError(t, a.Put(ctx, fmt.Sprintf("k%d", i), value(uint64(i), 1000), nil))
	}
	code, ans := adminJSON(t, "POST", base+"/api/v1/drain_jobs", fmt.Sprintf(`{"segments":[%q]}`, a.SegmentName()))
	require.Equal(t, 200, code, ans)
	id := ans["job_id"].(string)
	_, job := adminJSON(t, "GET", base+"/api/v1/drain_jobs/query?job_id="+id, "")
	assert.Equal(t, "RUNNING", job["status_name"])
	assert.Equal(t, 3.0, job["blocked_units"])
	assert.Equal(t, 0.0, job["active_units"])
	require.Error(t, a.Put(ctx, "nowhere", value(7, 100), nil), "the only segment drains")

	code, ans = adminJSON(t, "POST", base+"/api/v1/drain_jobs/cancel?job_id="+id, "")
	require.Equal(t, 200, code, ans)
	assert.Equal(t, map[string]any{"success": true, "job_id": id, "status": "CANCELED", "error_code": 0.0, "error_message": ""}, ans)
	_, job = adminJSON(t, "GET", base+"/api/v1/drain_jobs/query?job_id="+id, "")
	assert.Equal(t, 5.0, job["status"])
	assert.Equal(t, "Drain job canceled", job["message"])
	_, st := adminJSON(t, "GET", base+"/api/v1/segments/status?segment="+a.SegmentName(), "")
	assert.Equal(t, "OK", st["status_name"])
	require.NoError(t, a.Put(ctx, "again", value(8, 100), nil))
}

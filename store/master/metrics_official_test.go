package master

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// metricTypes reads the "# TYPE name type" lines of a Prometheus text
// exposition.
func metricTypes(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	return out
}

// metricValues reads the samples of a Prometheus text exposition, by
// series ("name" or "name{labels}").
func metricValues(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
}

// docRow is a row of docs/master-http.md's metric table.
type docRow struct{ ours, notes string }

// metricDocRows reads the table of docs/master-http.md headed "| Official
// | Ours | Notes |": official name -> (ours, notes), ours "—" for a name
// not exported.
func metricDocRows(t *testing.T) map[string]docRow {
	t.Helper()
	f, err := os.Open("../../docs/master-http.md")
	require.NoError(t, err)
	defer f.Close()
	out := map[string]docRow{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "| Official | Ours | Notes |":
			in = true
			continue
		case !in || line == "|---|---|---|":
			continue
		case line == "":
			in = false
			continue
		}
		cells := strings.Split(line, "|")
		require.Len(t, cells, 5, "docs/master-http.md: a metric row of three cells: %s", line)
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		out[name] = docRow{ours: strings.Trim(strings.TrimSpace(cells[2]), "`"), notes: strings.TrimSpace(cells[3])}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, out, "docs/master-http.md has no metric table")
	return out
}

// Every metric the official master exports (recorded in
// testdata/official: a default run, and one with snapshots on) is
// exported by ours with the same name and type, or listed in
// docs/master-http.md as not exported, with the reason. And the table
// does not claim what is not so: a name it says we export, we do.
func TestMetricNamesCoverOfficial(t *testing.T) {
	official := map[string]string{}
	for _, f := range []string{"metrics.txt", "metrics_snapshot.txt"} {
		b, err := os.ReadFile("testdata/official/" + f)
		require.NoError(t, err)
		for name, typ := range metricTypes(string(b)) {
			official[name] = typ
		}
	}
	require.Greater(t, len(official), 100, "the fixture lists the official metrics")

	m, c := startAdminMaster(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20)) // the per-segment gauges need one
	scraped := adminDo(t, m, "GET", "/metrics")
	assert.Equal(t, "text/plain; version=0.0.4", scraped.contentType, "the official content type")
	ours := metricTypes(scraped.body)
	// Text 0.0.4 even to a scraper that prefers OpenMetrics or protobuf, as
	// the official master answers.
	req, err := http.NewRequest("GET", "http://"+m.AdminAddr()+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "text/plain; version=0.0.4", resp.Header.Get("Content-Type"))
	assert.Equal(t, ours, metricTypes(string(b)))
	rows := metricDocRows(t)

	for name, typ := range official {
		row, documented := rows[name]
		if got, ok := ours[name]; ok {
			assert.Equal(t, typ, got, "%s: the official type", name)
			if documented {
				assert.Equal(t, name, row.ours, "%s: docs/master-http.md says another name is ours", name)
			}
			continue
		}
		if !assert.True(t, documented, "%s: neither exported nor in docs/master-http.md", name) {
			continue
		}
		assert.Equal(t, "—", row.ours, "%s: docs/master-http.md says %q is ours, but it is not exported", name, row.ours)
		assert.NotEmpty(t, row.notes, "%s: not exported, with no reason in docs/master-http.md", name)
	}
	for name, row := range rows {
		if row.ours != "—" {
			_, ok := ours[row.ours]
			assert.True(t, ok, "docs/master-http.md: %s is said exported as %s, which /metrics lacks", name, row.ours)
		}
	}
}

// The official metrics move with what the master does, by exactly what
// it did: puts, batch puts, lookups (hits and misses), existence checks,
// a remount, and evictions when a put finds the pool full.
func TestMetricValuesMove(t *testing.T) {
	m, c := startAdminMaster(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20))
	scrape := func() map[string]float64 { return metricValues(t, adminDo(t, m, "GET", "/metrics").body) }
	before := scrape()
	delta := func(now map[string]float64, series string) float64 {
		_, ok := now[series]
		require.True(t, ok, "%s is not exported", series)
		return now[series] - before[series]
	}

	sizes := []uint64{100, 5000, 70000, 4096, 1}
	var total uint64
	for i, n := range sizes {
		key := "k" + strconv.Itoa(i)
		putStartOver(t, ctx, c, key, n)
		res, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: "c1", Key: key})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
		total += n
	}
	bp, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{Items: []*storepb.PutStartRequest{
		{ClientId: "c1", Key: "b1", ValueLength: 10}, {ClientId: "c1", Key: "k0", ValueLength: 10}}}) // k0 exists
	require.NoError(t, err)
	require.NoError(t, bp.Items[0].Result.AsError())
	require.ErrorIs(t, bp.Items[1].Result.AsError(), storepb.ErrObjectAlreadyExists)
	for _, key := range []string{"k1", "k2", "missing"} {
		_, err := c.GetReplicaList(ctx, &storepb.KeyRequest{Key: key})
		require.NoError(t, err)
	}
	for _, key := range []string{"k1", "missing"} {
		_, err := c.ExistKey(ctx, &storepb.KeyRequest{Key: key})
		require.NoError(t, err)
	}
	res, err := c.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: "c1",
		Segments: []*storepb.Segment{seg("1", 0x10000000, 1<<20)}})
	require.NoError(t, err)
	require.NoError(t, res.AsError())

	now := scrape()
	for series, want := range map[string]float64{
		"master_put_start_requests_total":                float64(len(sizes)),
		"master_put_start_failures_total":                0,
		"master_put_end_requests_total":                  float64(len(sizes)),
		"master_value_size_bytes_count":                  float64(len(sizes) + 1), // and b1 of the batch
		"master_value_size_bytes_sum":                    float64(total + 10),
		`master_value_size_bytes_bucket{le="4096"}`:      4, // 100, 4096, 1 and b1's 10
		"master_batch_put_start_requests_total":          1,
		"master_batch_put_start_items_total":             2,
		"master_batch_put_start_failed_items_total":      1,
		"master_batch_put_start_partial_successes_total": 1,
		"master_get_replica_list_requests_total":         3,
		"master_get_replica_list_failures_total":         1, // a miss fails, as in Mooncake
		"total_get_nums_":                                3,
		"valid_get_nums_":                                2,
		"mem_cache_hit_nums_":                            2,
		"mem_cache_hit_bytes_total":                      float64(sizes[1] + sizes[2]),
		"file_cache_hit_nums_":                           0,
		"master_exist_key_requests_total":                2,
		"master_exist_key_failures_total":                0, // absent is an answer, not a failure
		"master_remount_segment_requests_total":          1,
		"master_re_mount_segment_requests_total":         1,                   // our older name stays
		"master_key_count":                               float64(len(sizes)), // b1's put is in flight
		"mem_cache_nums_":                                float64(len(sizes)),
	} {
		assert.Equal(t, want, delta(now, series), series)
	}
	assert.Equal(t, 0.0, now["ha_oplog_last_sequence_id"], "no journal without HA or Persist")
	assert.Equal(t, now["master_allocated_bytes"], now[`segment_allocated_bytes{segment="node-1"}`])
	assert.Equal(t, float64(1<<20), now[`segment_total_capacity_bytes{segment="node-1"}`])
	assert.GreaterOrEqual(t, now["master_allocated_bytes"], float64(total+10))

	// A put that finds no room evicts: an attempt that succeeds, and keys
	// gone.
	for i := range 4 {
		putStartOver(t, ctx, c, "big"+strconv.Itoa(i), 300<<10)
		res, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: "c1", Key: "big" + strconv.Itoa(i)})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
	now = scrape()
	ok := delta(now, "master_successful_evictions_total")
	assert.GreaterOrEqual(t, ok, 1.0)
	assert.GreaterOrEqual(t, delta(now, "master_attempted_evictions_total"), ok)
	assert.GreaterOrEqual(t, delta(now, "master_evicted_key_count"), ok)
	assert.Positive(t, delta(now, "master_evicted_size_bytes"))
}

// The master_promotion_* counters follow the promotions: a read of an
// object only on SSD admits one, a copy reported done completes it (with
// its bytes), one reported failed fails it.
func TestMetricPromotions(t *testing.T) {
	m, _ := startAdminMaster(t, ServerConfig{})
	svc := m.Service()
	ctx := t.Context()
	require.NoError(t, svc.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	disk := seg("2", 32<<20, 4<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, svc.MountSegment(ctx, "a", disk))
	put(t, svc, "a", "k", 4096, nil)
	tasks := svc.takeTasks(t.Context(), "a")
	require.Len(t, tasks, 1, "the put queues an offload")
	require.NoError(t, svc.MoveEnd(ctx, "a", tasks[0].Id, true))
	before := metricValues(t, adminDo(t, m, "GET", "/metrics").body)

	// promote drops k's DRAM replica, reads it (which queues the copy
	// back) and ends the copy as ok says.
	promote := func(ok bool) {
		sh := svc.shardOf("k")
		sh.mu.Lock()
		svc.evictLocked(sh, "k", sh.objects["k"], true)
		sh.mu.Unlock()
		_, _, _, _, err := svc.GetReplicaList("k")
		require.NoError(t, err)
		tasks := svc.takeTasks(t.Context(), "a")
		require.Len(t, tasks, 1, "the read queues a promotion")
		assert.Equal(t, 1.0, metricValues(t, adminDo(t, m, "GET", "/metrics").body)["master_promotion_in_flight"])
		require.NoError(t, svc.MoveEnd(ctx, "a", tasks[0].Id, ok))
	}
	promote(true)
	promote(false) // k still has its DRAM copy from the first: evicted again first
	now := metricValues(t, adminDo(t, m, "GET", "/metrics").body)
	for series, want := range map[string]float64{
		"master_promotion_admitted_total":        2,
		"master_promotion_completed_total":       1,
		"master_promotion_completed_bytes_total": 4096,
		"master_promotion_failed_total":          1,
		"master_promotion_cancelled_total":       0,
		"master_promotion_expired_total":         0,
		"master_promotion_in_flight":             0,
	} {
		assert.Equal(t, want, now[series]-before[series], series)
	}
}

// /metrics/summary is the official one-line summary: its sections in the
// official order (testdata/official/metrics_summary.txt; ours leaves out
// what it has not), sizes printed as there, and request rates over the
// interval since the previous summary.
func TestMetricsSummary(t *testing.T) {
	assert.Equal(t, []string{"0 B", "512 B", "40.29 KB", "64.00 MB", "1.50 GB"},
		[]string{humanBytes(0), humanBytes(512), humanBytes(41260), humanBytes(64 << 20), humanBytes(3 << 29)})

	m, c := startAdminMaster(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20))
	for i := range 4 {
		putStartOver(t, ctx, c, "k"+strconv.Itoa(i), 1024)
		res, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: "c1", Key: "k" + strconv.Itoa(i)})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
	sum := func() string {
		a := adminDo(t, m, "GET", "/metrics/summary")
		require.Equal(t, 200, a.code)
		assert.Equal(t, "text/plain; version=0.0.4", a.contentType)
		return a.body
	}
	got := sum()

	// The sections ("Name: ..." between " | "), in the official order.
	labels := func(line string) []string {
		_, master, ok := strings.Cut(line, "master={")
		require.True(t, ok, line)
		master, _, _ = strings.Cut(master, "}")
		var out []string
		for _, part := range strings.Split(master, " | ") {
			out = append(out, part[:strings.IndexAny(part, ":(")])
		}
		return out
	}
	b, err := os.ReadFile("testdata/official/metrics_summary.txt")
	require.NoError(t, err)
	official, ours := labels(string(b)), labels(got)
	assert.Equal(t, "role=leader, state=serving, service_ready=true, master={Mem Storage: 4.00 KB / 1.00 MB (0.4%) | SSD Storage: 0 B / 0 B | Keys: 4 (soft-pinned: 0) | Clients: 1 | ",
		got[:strings.Index(got, "Requests")])
	i := 0
	for _, l := range ours {
		for i < len(official) && official[i] != l {
			i++
		}
		assert.Less(t, i, len(official), "section %q of ours is not in the official summary, or out of its order", l)
	}
	// Four puts since the start: equal success and total rates, above 0;
	// none since the summary just made.
	rate := regexp.MustCompile(`Requests \(Success/Total per sec\): PutStart=([0-9.]+)/([0-9.]+),`)
	r := rate.FindStringSubmatch(got)
	require.NotNil(t, r, got)
	assert.Equal(t, r[1], r[2])
	assert.NotEqual(t, "0.00", r[2])
	r = rate.FindStringSubmatch(sum())
	require.NotNil(t, r)
	assert.Equal(t, []string{"0.00", "0.00"}, r[1:])
}

// Snapshots written by a master keeping its state on disk are counted in
// master_snapshot_success and timed in master_snapshot_duration_ms, and
// the summary says so.
func TestMetricSnapshots(t *testing.T) {
	m, c := startAdminMaster(t, ServerConfig{Persist: &PersistConfig{Dir: t.TempDir(), SnapshotEvery: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := metricValues(t, adminDo(t, m, "GET", "/metrics").body)
	assert.Equal(t, 0.0, v["master_snapshot_success"])
	assert.Equal(t, 0.0, v["master_snapshot_fail"])
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20)) // a record: a snapshot is due
	deadline := time.Now().Add(20 * time.Second)
	for v["master_snapshot_success"] == 0 {
		require.True(t, time.Now().Before(deadline), "no snapshot counted")
		time.Sleep(20 * time.Millisecond)
		v = metricValues(t, adminDo(t, m, "GET", "/metrics").body)
	}
	assert.Equal(t, v["master_snapshot_success"], v["master_snapshot_duration_ms_count"])
	assert.Equal(t, 0.0, v["master_snapshot_fail"])
	assert.Positive(t, m.SnapshotSeq())
	// The journal's last record: at least the mount's, which the snapshot covers.
	assert.GreaterOrEqual(t, v["ha_oplog_last_sequence_id"], float64(m.SnapshotSeq()))
	assert.Positive(t, v["ha_oplog_last_sequence_id"])
	assert.Contains(t, adminDo(t, m, "GET", "/metrics/summary").body, "| Snapshots: Success=")
}

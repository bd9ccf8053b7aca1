package client

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// The admin server exports Mooncake's master metric names and answers
// health, role and leader queries.
func TestMasterAdminEndpoints(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	reg := prometheus.NewRegistry()
	a := newClient(t, m.Addr(), 8<<20, func(c *Config) { c.Registerer = reg })
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "k", value(1, 1000), nil))
	_, err = a.Get(ctx, "missing")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	// y is larger than the pool: one allocation failure.
	errs := a.BatchPut(ctx, []string{"x", "y"}, [][]byte{value(2, 10), make([]byte, 64<<20)}, nil)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], storepb.ErrNoAvailableHandle)

	base := "http://" + m.AdminAddr()
	code, body := httpGet(t, base+"/metrics")
	require.Equal(t, 200, code)
	for _, want := range []string{
		"master_key_count 2", "master_total_capacity_bytes 8.388608e+06", "master_active_clients 1",
		"master_batch_put_start_requests_total", "master_batch_put_start_partial_successes_total 1",
		"master_batch_put_start_failed_items_total 1", "master_re_mount_segment_requests_total 1",
		"master_batch_get_replica_list_requests_total", "master_is_leader 1", "master_allocated_bytes",
	} {
		assert.Contains(t, body, want)
	}
	// The client's own metrics, with Mooncake's names.
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]bool{}
	for _, f := range fams {
		got[f.GetName()] = true
	}
	for _, want := range []string{"mooncake_transfer_read_bytes", "mooncake_transfer_write_bytes",
		"mooncake_transfer_latency_seconds", "mooncake_transfer_failures_total"} {
		assert.True(t, got[want], want)
	}

	code, body = httpGet(t, base+"/health")
	require.Equal(t, 200, code)
	var h map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &h))
	assert.Equal(t, "leader", h["role"])
	assert.EqualValues(t, 2, h["keys"])
	_, body = httpGet(t, base+"/role")
	assert.Equal(t, "leader", strings.TrimSpace(body))
	// Without HA there is no leader view, as with Mooncake's master.
	_, body = httpGet(t, base+"/leader")
	assert.JSONEq(t, `{"present":false,"leader_address":null,"view_version":null}`, body)
}

// metricSum adds up the samples of the named counters in a Prometheus text
// exposition.
func metricSum(t *testing.T, body string, names ...string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && slices.Contains(names, f[0]) {
			v, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err, line)
			sum += v
		}
	}
	return sum
}

// Reading a value into a buffer too small, asking its size, and reading it
// again (what a C or Python get of unknown size does) asks the master once:
// the size and the second read come from the lease the first lookup took.
func TestSizeWithinLeaseAsksMasterOnce(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	a := newClient(t, m.Addr(), 8<<20)
	b := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	want := value(3, 64<<10)
	require.NoError(t, a.Put(ctx, "big", want, nil))
	lookups := func() float64 {
		_, body := httpGet(t, "http://"+m.AdminAddr()+"/metrics")
		return metricSum(t, body, "master_get_replica_list_requests_total", "master_batch_get_replica_list_requests_total")
	}
	before := lookups()
	_, err = b.GetInto(ctx, "big", make([]byte, 4096))
	require.ErrorIs(t, err, storepb.ErrInvalidParams)
	n, err := b.Size(ctx, "big")
	require.NoError(t, err)
	require.Equal(t, uint64(len(want)), n)
	dst := make([]byte, n)
	got, err := b.GetInto(ctx, "big", dst)
	require.NoError(t, err)
	require.Equal(t, want, dst[:got])
	assert.Equal(t, before+1, lookups())
	// Without a lease held, Size asks (and its answer is the master's).
	_, err = b.Size(ctx, "missing")
	assert.ErrorIs(t, err, storepb.ErrObjectNotFound)
}

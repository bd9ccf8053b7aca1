package master

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// startAdminMaster starts a master with an admin server on loopback and
// dials its gRPC port.
func startAdminMaster(t *testing.T, cfg ServerConfig) (*Server, storepb.MasterClient) {
	t.Helper()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	m, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	conn, err := grpc.NewClient(m.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return m, storepb.NewMasterClient(conn)
}

type httpAnswer struct {
	code        int
	contentType string
	body        string
}

func adminDo(t *testing.T, m *Server, method, path string) httpAnswer {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+m.AdminAddr()+path, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return httpAnswer{resp.StatusCode, resp.Header.Get("Content-Type"), string(b)}
}

func mountOver(t *testing.T, ctx context.Context, c storepb.MasterClient, client string, sg *storepb.Segment) {
	t.Helper()
	res, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: client, Segment: sg})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
}

// putStartOver starts a put of n bytes and returns its one replica.
func putStartOver(t *testing.T, ctx context.Context, c storepb.MasterClient, key string, n uint64) *storepb.MemoryReplica {
	t.Helper()
	ps, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: key, ValueLength: n})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
	require.Len(t, ps.Replicas, 1)
	return ps.Replicas[0].GetMemory()
}

func descJSON(r *storepb.MemoryReplica) string {
	return fmt.Sprintf(`{"size_":%d,"buffer_address_":%d,"protocol_":"tcp","transport_endpoint_":%q}`,
		r.Size, r.BufferAddress, r.TransportEndpoint)
}

// The inspection endpoints of the admin server answer with Mooncake's
// paths, parameters and formats, from a real master over real HTTP:
// /get_all_segments lists the mounted segment names (empty with none, as
// SGLang's MOONCAKE_CHECK_SERVER waits for), /query_key and
// /batch_query_keys describe replicas as Mooncake's buffer descriptors,
// bad parameters are 400 and unknown keys 404.
func TestAdminInspection(t *testing.T) {
	m, c := startAdminMaster(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const text = "text/plain; version=0.0.4"
	const jsonType = "application/json; charset=utf-8"
	const noTiers = `"disk_values":null,"local_disk_values":null,"nof_values":null`

	// Nothing mounted: empty bodies, not errors.
	for _, path := range []string{"/get_all_segments", "/get_all_keys"} {
		assert.Equal(t, httpAnswer{200, text, ""}, adminDo(t, m, "GET", path), path)
	}
	a := adminDo(t, m, "GET", "/get_segments_detail")
	assert.JSONEq(t, `{"total_segments":0,"segments":[]}`, a.body)

	// c1 mounts two segments under one name (as a client with several
	// buffers does), c2 one and an SSD tier, which the lists leave out.
	for _, s := range []struct {
		client string
		sg     *storepb.Segment
	}{
		{"c1", &storepb.Segment{Id: "a1", Name: "node-a", Base: 0x10000000, Size: 1 << 20, TransportEndpoint: "127.0.0.1:7001", Protocol: "tcp"}},
		{"c1", &storepb.Segment{Id: "a2", Name: "node-a", Base: 0x20000000, Size: 1 << 20, TransportEndpoint: "127.0.0.1:7001", Protocol: "tcp"}},
		{"c2", &storepb.Segment{Id: "b1", Name: "node-b", Base: 0x30000000, Size: 3 << 19, TransportEndpoint: "127.0.0.1:7002", Protocol: "tcp"}},
		{"c2", &storepb.Segment{Id: "b2", Name: "node-b-ssd", Base: 0x40000000, Size: 1 << 20, TransportEndpoint: "127.0.0.1:7002",
			Protocol: "tcp", Medium: storepb.Medium_MEDIUM_DISK}},
	} {
		mountOver(t, ctx, c, s.client, s.sg)
	}
	// k1 and k2 readable, p a put in flight (its space counts as used).
	used := map[string]uint64{}
	reps := map[string]*storepb.MemoryReplica{}
	for _, p := range []struct {
		key string
		n   uint64
	}{{"k1", 4096}, {"k2", 64}, {"p", 128}} {
		r := putStartOver(t, ctx, c, p.key, p.n)
		reps[p.key] = r
		used[r.SegmentName] += p.n
		if p.key != "p" {
			res, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: "c1", Key: p.key})
			require.NoError(t, err)
			require.NoError(t, res.AsError())
		}
	}

	cases := []struct {
		name, method, path string
		code               int
		contentType        string
		body               string // exact text, or JSON compared as JSON
	}{
		{"segment names, one per mounted DRAM segment, sorted", "GET", "/get_all_segments", 200, text, "node-a\nnode-a\nnode-b\n"},
		{"readable keys only", "GET", "/get_all_keys", 200, text, "k1\nk2\n"},
		{"a key's replicas as Mooncake's descriptors", "GET", "/query_key?key=k1", 200, jsonType,
			`{"success":true,"data":[` + descJSON(reps["k1"]) + `]}`},
		{"unknown key: 404 with Mooncake's body", "GET", "/query_key?key=nope", 404, jsonType,
			`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`},
		{"a put in flight is not readable yet", "GET", "/query_key?key=p", 404, jsonType,
			`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`},
		{"no key parameter: no such object, as Mooncake says", "GET", "/query_key", 404, jsonType,
			`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`},
		{"empty key", "GET", "/query_key?key=", 404, jsonType,
			`{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}`},
		{"batch: each key answered apart", "GET", "/batch_query_keys?keys=k2,nope,k1", 200, jsonType,
			`{"success":true,"data":{"k1":{"ok":true,"error":null,"values":[` + descJSON(reps["k1"]) + `],` + noTiers + `},` +
				`"k2":{"ok":true,"error":null,"values":[` + descJSON(reps["k2"]) + `],` + noTiers + `},` +
				`"nope":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,` + noTiers + `}}}`},
		{"batch without keys: Mooncake's 400", "GET", "/batch_query_keys", 400, jsonType,
			`{"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}`},
		{"a segment name's usage, summed over its segments", "GET", "/query_segment?segment=node-a", 200, text,
			fmt.Sprintf("node-a\nUsed(bytes): %d\nCapacity(bytes) : %d\n", used["node-a"], 2<<20)},
		{"unknown segment: Mooncake's 500", "GET", "/query_segment?segment=node-x", 500, text, "Failed to query segment"},
		{"an SSD tier is no memory segment", "GET", "/query_segment?segment=node-b-ssd", 500, text, "Failed to query segment"},
		{"no segment parameter", "GET", "/query_segment", 500, text, "Failed to query segment"},
		{"GET only: another method is Mooncake's 404", "POST", "/get_all_segments", 404, "", "404 Not Found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := adminDo(t, m, tc.method, tc.path)
			assert.Equal(t, tc.code, a.code)
			assert.Equal(t, tc.contentType, a.contentType)
			if strings.HasPrefix(tc.contentType, "application/json") {
				assert.JSONEq(t, tc.body, a.body)
			} else {
				assert.Equal(t, tc.body, a.body)
			}
		})
	}

	// The detail of every DRAM segment, with Mooncake's field names.
	a = adminDo(t, m, "GET", "/get_segments_detail")
	require.Equal(t, 200, a.code)
	var detail struct {
		Total    int              `json:"total_segments"`
		Segments []map[string]any `json:"segments"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &detail))
	require.Equal(t, 3, detail.Total)
	require.Len(t, detail.Segments, 3)
	b1 := detail.Segments[2]
	assert.Equal(t, map[string]any{
		"segment_name": "node-b", "segment_id": "b1", "client_id": "c2", "base_address": "0x30000000",
		"size_bytes": float64(3 << 19), "size_human": "0.00146484 GiB", "te_endpoint": "127.0.0.1:7002", "protocol": "tcp",
		"status": "OK", "allocator_used_bytes": float64(used["node-b"]), "allocator_capacity_bytes": float64(3 << 19),
		"allocator_usage_percent": float64(used["node-b"]) / float64(3<<19) * 100,
	}, b1)
	var sum float64
	for _, sg := range detail.Segments {
		sum += sg["allocator_used_bytes"].(float64)
	}
	assert.Equal(t, float64(4096+64+128), sum)

	// Looking is not reading: query_key grants no lease, so a plain
	// Remove (which a lease would refuse) goes through.
	res, err := c.Remove(ctx, &storepb.RemoveRequest{Key: "k1"})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
	assert.Equal(t, "k2\n", adminDo(t, m, "GET", "/get_all_keys").body)

	// Unmounted, the segments leave the list.
	for _, u := range [][2]string{{"c1", "a1"}, {"c1", "a2"}, {"c2", "b1"}} {
		res, err := c.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: u[0], SegmentId: u[1]})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
	assert.Equal(t, httpAnswer{200, text, ""}, adminDo(t, m, "GET", "/get_all_segments"))
}

// Under HA the leader answers the inspection endpoints; a standby, whose
// view would be stale, answers 503 as its /leader does.
func TestAdminInspectionHA(t *testing.T) {
	etcd := etcdtest.Start(t)
	ha := func() ServerConfig {
		return ServerConfig{HA: &HAConfig{Etcd: []string{etcd}, ClusterID: "admin", LeaderTTL: 3 * time.Second}}
	}
	m1, c1 := startAdminMaster(t, ha())
	m2, c2 := startAdminMaster(t, ha())
	leader, standby, c := m1, m2, c1
	deadline := time.Now().Add(20 * time.Second)
	for !m1.Leading() && !m2.Leading() {
		require.True(t, time.Now().Before(deadline), "no master leads")
		time.Sleep(10 * time.Millisecond)
	}
	if m2.Leading() {
		leader, standby, c = m2, m1, c2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20))

	assert.Equal(t, "node-1\n", adminDo(t, leader, "GET", "/get_all_segments").body)

	// Both name the leader and its term (the view version), as Mooncake's
	// masters do under HA; the standby says it is one, and not serving.
	view := fmt.Sprintf(`{"present":true,"leader_address":%q,"view_version":%d}`, leader.advertise(), leader.Term())
	for _, m := range []*Server{leader, standby} {
		a := adminDo(t, m, "GET", "/leader")
		assert.Equal(t, 200, a.code)
		assert.JSONEq(t, view, a.body)
	}
	var h map[string]any
	require.NoError(t, json.Unmarshal([]byte(adminDo(t, standby, "GET", "/health").body), &h))
	assert.Equal(t, map[string]any{"status": "ok", "role": "standby", "ha_state": "standby", "service_ready": false,
		"leader_address": leader.advertise(), "view_version": float64(leader.Term())},
		map[string]any{"status": h["status"], "role": h["role"], "ha_state": h["ha_state"], "service_ready": h["service_ready"],
			"leader_address": h["leader_address"], "view_version": h["view_version"]})
	assert.Equal(t, "standby", adminDo(t, standby, "GET", "/role").body)
	assert.Equal(t, "standby", adminDo(t, standby, "GET", "/ha_status").body)
	assert.Equal(t, "serving", adminDo(t, leader, "GET", "/ha_status").body)
	// /readyz, ours, is the leader-only readiness probe.
	for m, want := range map[*Server]struct {
		code int
		body string
	}{leader: {200, "ok"}, standby: {503, "standby"}} {
		a := adminDo(t, m, "GET", "/readyz")
		assert.Equal(t, want.code, a.code)
		assert.Equal(t, want.body, a.body)
	}
	for _, path := range []string{"/get_all_segments", "/get_all_keys", "/query_key?key=k",
		"/batch_query_keys?keys=k", "/query_segment?segment=node-1", "/get_segments_detail"} {
		a := adminDo(t, standby, "GET", path)
		assert.Equal(t, 503, a.code, path)
		assert.Equal(t, "not the leader\n", a.body, path)
	}
}

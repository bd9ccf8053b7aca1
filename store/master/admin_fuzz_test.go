package master

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// adminPaths is every path of the admin HTTP server, by the byte that picks
// it in FuzzAdminHTTP's input.
var adminPaths = []string{
	"/metrics", "/metrics/summary", "/health", "/role", "/ha_status", "/readyz", "/leader", "/kv_events/status",
	"/get_all_segments", "/query_segment", "/get_segments_detail", "/get_all_keys", "/query_key", "/batch_query_keys",
	"/api/v1/segments/status", "/api/v1/drain_jobs/query", "/api/v1/drain_jobs", "/api/v1/drain_jobs/cancel",
	"/api/v1/remove_all", "/api/v1/tenant_quotas", "/nowhere",
}

var adminMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}

// FuzzAdminHTTP sends the admin HTTP server arbitrary requests (method,
// path, query, body), as anyone who reaches its port may: each gets an
// answer with a status code and never panics, and the master goes on
// answering, with no lock left held (a drain job created by one request,
// say, is queried and cancelled by the next). Input: method and path
// bytes, then the raw query and the body, split at the first 0 byte.
func FuzzAdminHTTP(f *testing.F) {
	m, err := Start(ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(f, err)
	f.Cleanup(func() { _ = m.Close() })
	svc := m.Service()
	for _, c := range []string{"1", "2"} {
		require.NoError(f, svc.MountSegment(f.Context(), "c"+c, seg(c, uint64(c[0]-'0')<<24, 1<<20)))
	}
	for i := range 8 {
		_, err := svc.PutStart(f.Context(), "c1", fmt.Sprint("k", i), 4096, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
		require.NoError(f, err)
		require.NoError(f, svc.PutEnd(f.Context(), "c1", fmt.Sprint("k", i), 0))
	}
	h := m.admin.Handler
	add := func(method, path int, query, body string) {
		f.Add(append(append([]byte{byte(method), byte(path)}, query...), append([]byte{0}, body...)...))
	}
	add(1, 16, "", `{"segments":["node-1"],"max_concurrency":2}`)
	add(0, 15, "job_id=x", "")
	add(1, 17, "", `{"job_id":"x"}`)
	add(0, 12, "key=k1", "")
	add(0, 13, "keys=k1,k2,,k3", "")
	add(2, 19, "", `{"tenant":"t","bytes":1024}`)
	add(1, 18, "force=true", "")
	add(0, 9, "segment=node-2", "")
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		method, path := adminMethods[int(in[0])%len(adminMethods)], adminPaths[int(in[1])%len(adminPaths)]
		query, body, _ := bytes.Cut(in[2:], []byte{0})
		adminRequest(t, h, method, path, string(query), body)
		// The master still answers, its locks free.
		require.Equal(t, http.StatusOK, adminRequest(t, h, http.MethodGet, "/get_all_segments", "", nil))
		require.Equal(t, http.StatusOK, adminRequest(t, h, http.MethodGet, "/get_all_keys", "", nil))
	})
}

// adminRequest serves one request with h and returns its status code; a
// panic or no answer in 10 s fails t.
func adminRequest(t *testing.T, h http.Handler, method, path, query string, body []byte) int {
	t.Helper()
	req := httptest.NewRequest(method, "http://master/", bytes.NewReader(body))
	req.URL.Path, req.URL.RawQuery = path, query
	w := httptest.NewRecorder()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		h.ServeHTTP(w, req)
	}()
	select {
	case p := <-done:
		if p != nil {
			t.Fatalf("%s %s?%q: panic: %v", method, path, query, p)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s %s?%q: no answer in 10 s", method, path, query)
	}
	require.GreaterOrEqual(t, w.Code, 200, "%s %s?%q", method, path, query)
	return w.Code
}

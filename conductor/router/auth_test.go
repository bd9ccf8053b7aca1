package router

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor/indexer"
)

// TestAuth: with Config.Token the instance API, the index query and the
// Indexer's API refuse a request without the token (or with another) with
// 401 and serve one with it; the OpenAI routes and the probes stay open
// unless TokenOnInference.
func TestAuth(t *testing.T) {
	const token = "conductor-token"
	admin := []struct{ method, path, body string }{
		{"GET", "/v1/instances", ""},
		{"POST", "/v1/instances", `{"id":"d9","role":"decode","url":"http://127.0.0.1:1"}`},
		{"GET", "/v1/instances/p0", ""},
		{"DELETE", "/v1/instances/d9", ""}, // the one POSTed above
		{"POST", "/v1/index/query", `{"token_ids":[1,2,3]}`},
		{"POST", "/register", `{}`},
		{"POST", "/unregister", `{}`},
		{"POST", "/query", `{}`},
		{"POST", "/query_by_hash", `{}`},
		{"GET", "/services", ""},
	}
	inference := []struct{ method, path, body string }{
		{"POST", "/v1/completions", string(mustJSON(goodBody))},
		{"GET", "/v1/models", ""},
	}
	probes := []struct{ method, path, body string }{{"GET", "/health", ""}, {"GET", "/metrics", ""}}

	tests := []struct {
		name        string
		onInference bool
	}{
		// The admin API requires the token; inference and probes are open.
		{"admin", false},
		// Inference requires it too.
		{"inference", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, es := cluster(t, 1, 1)
			idx := indexer.New(indexer.Config{})
			t.Cleanup(idx.Close)
			h := newHarness(t, nil, func(c *Config) {
				c.Token, c.TokenOnInference, c.Indexer = token, tt.onInference, idx
			}, es...)
			do := func(method, path, body, tok string) (int, string) {
				t.Helper()
				req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				if tok != "" {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				resp, err := h.client.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			closed, open := slices.Clone(admin), slices.Clone(probes)
			if tt.onInference {
				closed = append(closed, inference...)
			} else {
				open = append(open, inference...)
			}
			for _, r := range closed {
				code, body := do(r.method, r.path, r.body, "")
				assert.Equal(t, http.StatusUnauthorized, code, "%s %s without the token: %s", r.method, r.path, body)
				assert.Contains(t, body, "missing bearer token", r.path)
				code, body = do(r.method, r.path, r.body, "other")
				assert.Equal(t, http.StatusUnauthorized, code, "%s %s with another token: %s", r.method, r.path, body)
				assert.Contains(t, body, "wrong bearer token", r.path)
				code, body = do(r.method, r.path, r.body, token)
				assert.NotEqual(t, http.StatusUnauthorized, code, "%s %s with the token: %s", r.method, r.path, body)
			}
			for _, r := range open {
				code, body := do(r.method, r.path, r.body, "")
				assert.NotEqual(t, http.StatusUnauthorized, code, "%s %s is open: %s", r.method, r.path, body)
			}
			h.rr.waitIdle(t)
		})
	}
}

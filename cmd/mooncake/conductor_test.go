package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/router"
)

// standinEngine is a minimal vLLM OpenAI server of one role that checks
// the disaggregated-serving protocol: prefill requests carry max_tokens=1
// and kv_transfer_params {do_remote_decode: true}, and answer the
// parameters decode requests must carry back.
func standinEngine(t *testing.T, role string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		kv, _ := body["kv_transfer_params"].(map[string]any)
		rid := r.Header.Get("X-Request-Id")
		w.Header().Set("Content-Type", "application/json")
		if role == "prefill" {
			if body["max_tokens"] != float64(1) || kv["do_remote_decode"] != true || rid == "" {
				t.Errorf("prefill got %v (X-Request-Id %q)", body, rid)
				http.Error(w, "bad prefill request", http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_request_id":%q}}`, rid)
			return
		}
		if kv["do_remote_prefill"] != true || kv["remote_request_id"] != rid {
			t.Errorf("decode got kv_transfer_params %v for %s", kv, rid)
			http.Error(w, "bad decode request", http.StatusBadRequest)
			return
		}
		if body["stream"] != true {
			fmt.Fprint(w, `{"choices":[{"text":"hello"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"hel\"}]}\n\ndata: {\"choices\":[{\"text\":\"lo\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// `mooncake conductor` runs as its own process with instances from flags
// and from a config file, prints where it listens, routes streamed and
// whole requests through prefill then decode, registers instances at run
// time, and stops cleanly on SIGTERM.
func TestConductorCommand(t *testing.T) {
	p0, d0, d1 := standinEngine(t, "prefill"), standinEngine(t, "decode"), standinEngine(t, "decode")
	cfgFile := filepath.Join(t.TempDir(), "conductor.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(
		"idle-timeout: 5s\ninstances:\n  - {id: d1, role: decode, url: %q}\n", d1.URL)), 0o644))
	cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0", "--config_path", cfgFile,
		"--prefill", "p0="+p0.URL+",cache_blocks=64", "--decode", "d0="+d0.URL)
	line := startProc(t, cmd, "conductor listening ")
	require.Contains(t, line, "prefill=1 decode=2")
	base := strings.Fields(strings.TrimPrefix(line, "conductor listening "))[0]
	require.True(t, strings.HasPrefix(base, "http://127.0.0.1:"), line)

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	post := func(path, body string) (int, string) {
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, body := post("/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":8}`)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `"hello"`)
	for range 2 { // both decode instances answer
		status, body = post("/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":8,"stream":true}`)
		require.Equal(t, http.StatusOK, status, body)
		assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)
	}
	status, body = post("/v1/completions", `{"model":"m","prompt":`)
	assert.Equal(t, http.StatusBadRequest, status, body)

	status, body = post("/v1/instances", `{"id":"d2","role":"decode","url":"`+d0.URL+`"}`)
	require.Equal(t, http.StatusCreated, status, body)
	resp, err := client.Get(base + "/health")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"status":"ok","ready":true,"prefill":1,"decode":3,"reachable_prefill":1,"reachable_decode":3,
		"unreachable":[],"inflight":0}`, string(b))
	resp, err = client.Get(base + "/metrics")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `mooncake_conductor_requests_total{outcome="ok",route="completions"} 3`)
	assert.Contains(t, string(b), "go_goroutines")

	stopOnSIGTERM(t, cmd, "conductor")
}

// Bad instances and settings stop the command before it listens, naming
// what is wrong.
func TestConductorCommandErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // named in the message
		is   error  // the cause, where the router has a sentinel for it
	}{
		// An instance spec without a URL.
		{"no url", []string{"--prefill", "p0"}, "--prefill", router.ErrInvalidInstance},
		// A decode URL with a path.
		{"url with path", []string{"--decode", "d0=http://127.0.0.1:1/v1"}, "root", router.ErrInvalidInstance},
		// Two instances with one ID.
		{"duplicate", []string{"--prefill", "x=http://127.0.0.1:1", "--decode", "x=http://127.0.0.1:2"}, "Instances[1]",
			router.ErrDuplicateInstance},
		// A duration that is not one.
		{"bad timeout", []string{"--idle-timeout", "soon"}, "--idle-timeout", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot()
			root.SetArgs(append([]string{"conductor", "--listen", "127.0.0.1:0"}, tc.args...))
			root.SetOut(io.Discard)
			err := root.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
		})
	}
}

func TestLoRAModulesFlag(t *testing.T) {
	m, err := loraModules([]string{"sql=/adapters/sql", "chat=/a=b"})
	if err != nil || len(m) != 2 || m["sql"] != "/adapters/sql" || m["chat"] != "/a=b" {
		t.Fatalf("loraModules = %v, %v", m, err)
	}
	for _, bad := range [][]string{{"sql"}, {"=/p"}, {"sql="}, {"a=/x", "a=/y"}} {
		if _, err := loraModules(bad); err == nil {
			t.Errorf("loraModules(%q) accepted", bad)
		}
	}
	if m, err := loraModules(nil); m != nil || err != nil {
		t.Fatalf("no flag: %v, %v", m, err)
	}
}

func TestPrefillModelFlag(t *testing.T) {
	m, err := prefillModel("10ms, 1ms,2ns")
	if err != nil || m.Base != 0.01 || m.Linear != 0.001 || m.Quadratic != 2e-9 {
		t.Fatalf("prefillModel = %+v, %v", m, err)
	}
	if m, err := prefillModel(""); err != nil || m != (conductor.PrefillModel{}) {
		t.Fatalf("empty: %+v, %v", m, err)
	}
	for _, bad := range []string{"10ms", "1,2", "1ms,2ms,3ms,4ms", "-1ms,1ms", "0s,0s"} {
		if _, err := prefillModel(bad); err == nil {
			t.Errorf("prefillModel(%q) accepted", bad)
		}
	}
}

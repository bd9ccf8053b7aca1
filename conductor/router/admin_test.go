package router

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

// The registration API keeps the router and the scheduler in step and
// answers each mistake with its own status.
func TestInstancesAPI(t *testing.T) {
	_, es := cluster(t, 1, 1)
	h := newHarness(t, nil, nil, es[0])
	steps := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		msg    string
	}{
		// A new decode instance registers.
		{"register", "POST", "/v1/instances", map[string]any{"id": "d0", "role": "decode", "url": es[1].srv.URL + "/"}, 201, ""},
		// The same ID again conflicts.
		{"duplicate", "POST", "/v1/instances", map[string]any{"id": "d0", "role": "decode", "url": es[1].srv.URL}, 409, "already registered"},
		// Bad fields name themselves.
		{"bad role", "POST", "/v1/instances", map[string]any{"id": "x", "role": "both", "url": "http://h:1"}, 400, "role"},
		{"no id", "POST", "/v1/instances", map[string]any{"role": "decode", "url": "http://h:1"}, 400, "id"},
		{"store is reserved", "POST", "/v1/instances", map[string]any{"id": "store", "role": "prefill", "url": "http://h:1"}, 400, "store"},
		{"url with /v1", "POST", "/v1/instances", map[string]any{"id": "x", "role": "decode", "url": "http://h:1/v1"}, 400, "root"},
		{"url without scheme", "POST", "/v1/instances", map[string]any{"id": "x", "role": "decode", "url": "h:1"}, 400, "url"},
		{"negative cache", "POST", "/v1/instances", map[string]any{"id": "x", "role": "prefill", "url": "http://h:1", "cache_blocks": -1}, 400, "cache_blocks"},
		{"unknown field", "POST", "/v1/instances", map[string]any{"id": "x", "role": "prefill", "url": "http://h:1", "weight": 2}, 400, "weight"},
		{"not JSON", "POST", "/v1/instances", "{", 400, "malformed"},
		// Lookups and removal of unknown instances are 404.
		{"get unknown", "GET", "/v1/instances/zz", nil, 404, "unknown instance"},
		{"delete unknown", "DELETE", "/v1/instances/zz", nil, 404, "unknown instance"},
		{"wrong method", "PUT", "/v1/instances", nil, 405, "GET or POST"},
		// A request routes through the registered pair.
		{"route", "POST", "/v1/completions", goodBody, 200, ""},
		// Removal takes the instance out of routing: 503 after.
		{"delete", "DELETE", "/v1/instances/d0", nil, 200, ""},
		{"route without decode", "POST", "/v1/completions", goodBody, 503, "cannot schedule"},
	}
	for _, s := range steps {
		a := h.do(s.method, s.path, s.body)
		require.Equal(t, s.status, a.status, "%s: %s", s.name, a.body)
		if s.status >= 400 {
			assert.Contains(t, a.apiErr(t).Message, s.msg, s.name)
		}
	}
	a := h.do("GET", "/v1/instances", nil)
	require.Equal(t, 200, a.status)
	var list struct{ Instances []Instance }
	require.NoError(t, json.Unmarshal(a.body, &list))
	assert.Equal(t, []Instance{es[0].instance()}, list.Instances)
	a = h.do("GET", "/v1/instances/p0", nil)
	require.Equal(t, 200, a.status)
	assert.Contains(t, string(a.body), `"role":"prefill"`)
	h.rr.mu.Lock()
	assert.Equal(t, []string{"p0"}, h.rr.order, "the scheduler holds what the router holds")
	h.rr.mu.Unlock()
	assert.Equal(t, 1.0, h.metric(`mooncake_conductor_instances{role="prefill"}`))
	assert.Equal(t, 0.0, h.metric(`mooncake_conductor_instances{role="decode"}`))
	h.rr.waitIdle(t)
}

// The index query hashes token ids into blocks as the scheduler does, or
// takes block hashes as they are, and answers the scheduler's longest
// prefix per holder.
func TestIndexQuery(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.rr.longest = map[string]int{"p0": 2, conductor.StoreHolder: 1}
	cases := []struct {
		name   string
		body   string
		status int
		blocks []uint64 // what the scheduler is asked
	}{
		// 1100 tokens make two full blocks; the tail is not a block.
		{"tokens", `{"tokens":` + mustJSON(ids(1100)) + `}`, 200, conductor.HashTokens(ids(1100))},
		// Hashes go through untouched, 64-bit values included.
		{"hashes", `{"hashes":[1,18446744073709551615]}`, 200, []uint64{1, 1<<64 - 1}},
		// Exactly one of the two.
		{"both", `{"tokens":[1],"hashes":[1]}`, 400, nil},
		{"neither", `{}`, 400, nil},
		{"not JSON", `{"tokens":`, 400, nil},
		{"negative hash", `{"hashes":[-1]}`, 400, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.rr.queries())
			a := h.do("POST", "/v1/index/query", tc.body)
			require.Equal(t, tc.status, a.status, "%s", a.body)
			if tc.status != 200 {
				a.apiErr(t)
				assert.Len(t, h.rr.queries(), before)
				return
			}
			var ans indexAnswer
			require.NoError(t, json.Unmarshal(a.body, &ans))
			assert.Equal(t, map[string]int{"p0": 2, "store": 1}, ans.PrefixBlocks)
			assert.Equal(t, len(tc.blocks), ans.Blocks)
			asked := h.rr.queries()
			require.Len(t, asked, before+1)
			assert.Equal(t, tc.blocks, asked[before])
		})
	}
	a := h.do("GET", "/v1/index/query", nil)
	assert.Equal(t, 405, a.status)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// /health says whether the router can route; /metrics serves the router's
// series in Prometheus' text format; /v1/models comes from an engine.
func TestHealthMetricsModels(t *testing.T) {
	_, es := cluster(t, 1, 1)
	h := newHarness(t, nil, nil, es[0])

	status, hl := h.health()
	require.Equal(t, 503, status)
	assert.Equal(t, health{Status: "unavailable", Ready: false, Prefill: 1, ReachablePrefill: 1, Unreachable: []unreachable{}}, hl,
		"no decode instance: not ready")

	require.NoError(t, h.router.Register(es[1].instance()))
	status, hl = h.health()
	require.Equal(t, 200, status)
	assert.Equal(t, health{Status: "ok", Ready: true, Prefill: 1, Decode: 1, ReachablePrefill: 1, ReachableDecode: 1,
		Unreachable: []unreachable{}}, hl)

	a := h.do("POST", "/v1/completions", goodBody)
	require.Equal(t, 200, a.status)
	a = h.do("GET", "/metrics", nil)
	require.Equal(t, 200, a.status)
	for _, name := range []string{"mooncake_conductor_requests_total", "mooncake_conductor_e2e_seconds_bucket",
		"mooncake_conductor_prefill_seconds_count", "mooncake_conductor_inflight_requests", "mooncake_conductor_rejected_total"} {
		assert.Contains(t, string(a.body), name)
	}

	a = h.do("GET", "/v1/models", nil)
	require.Equal(t, 200, a.status, "%s", a.body)
	assert.Contains(t, string(a.body), `"id":"tiny"`)
	h.rr.waitIdle(t)
}

// Config.Validate names the bad field.
func TestConfigValidate(t *testing.T) {
	rr := newRR()
	ok := Instance{ID: "p0", Role: RolePrefill, URL: "http://127.0.0.1:1"}
	cases := []struct {
		name string
		cfg  Config
		want string // fragment of the error; empty: valid
	}{
		{"valid", Config{Scheduler: rr, Instances: []Instance{ok}}, ""},
		{"zero values are defaults", Config{Scheduler: rr}, ""},
		{"no scheduler", Config{}, "Config.Scheduler"},
		{"negative prefill timeout", Config{Scheduler: rr, PrefillTimeout: -1}, "Config.PrefillTimeout"},
		{"negative decode timeout", Config{Scheduler: rr, DecodeTimeout: -time.Second}, "Config.DecodeTimeout"},
		{"negative idle timeout", Config{Scheduler: rr, IdleTimeout: -1}, "Config.IdleTimeout"},
		{"negative body limit", Config{Scheduler: rr, MaxBodyBytes: -1}, "Config.MaxBodyBytes"},
		{"bad instance", Config{Scheduler: rr, Instances: []Instance{{ID: "x", Role: "prefill"}}}, "Config.Instances[0]"},
		{"duplicate instance", Config{Scheduler: rr, Instances: []Instance{ok, ok}}, "Config.Instances[1]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want, "the error names the field")
			assert.True(t, strings.HasPrefix(err.Error(), "router: "), err.Error())
		})
	}
}

// The command-line form of an instance.
func TestParseInstance(t *testing.T) {
	cases := []struct {
		name, role, spec string
		want             Instance
		err              string
	}{
		{"url only", RoleDecode, "d0=http://10.0.0.2:8200", Instance{ID: "d0", Role: RoleDecode, URL: "http://10.0.0.2:8200"}, ""},
		{"trailing slash", RoleDecode, "d0=http://h:1/", Instance{ID: "d0", Role: RoleDecode, URL: "http://h:1"}, ""},
		{"all options", RolePrefill, "p0=http://h:8100,cache_blocks=4096,engine_id=e0,bootstrap_addr=http://h:8998",
			Instance{ID: "p0", Role: RolePrefill, URL: "http://h:8100", CacheBlocks: 4096, EngineID: "e0", Bootstrap: "http://h:8998"}, ""},
		{"no url", RolePrefill, "p0", Instance{}, "want id=url"},
		{"bad number", RolePrefill, "p0=http://h:1,cache_blocks=many", Instance{}, "cache_blocks"},
		{"unknown option", RolePrefill, "p0=http://h:1,weight=2", Instance{}, "unknown option"},
		{"option without value", RolePrefill, "p0=http://h:1,cache_blocks", Instance{}, "not key=value"},
		{"bad url", RolePrefill, "p0=ftp://h:1", Instance{}, "url"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseInstance(tc.role, tc.spec)
			if tc.err != "" {
				require.ErrorIs(t, err, ErrInvalidInstance)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// failingAdd is a scheduler that refuses to add one instance.
type failingAdd struct {
	*rrScheduler
	refuse string
}

func (f failingAdd) Add(in conductor.Instance) error {
	if in.ID == f.refuse {
		return errors.New("no room")
	}
	return f.rrScheduler.Add(in)
}

// New that fails halfway leaves the scheduler as it found it.
func TestNewCleansUpWhenRegistrationFails(t *testing.T) {
	rr := newRR()
	_, err := New(Config{Scheduler: failingAdd{rr, "d0"}, Instances: []Instance{
		{ID: "p0", Role: RolePrefill, URL: "http://127.0.0.1:1"},
		{ID: "d0", Role: RoleDecode, URL: "http://127.0.0.1:2"},
	}})
	require.ErrorIs(t, err, ErrInvalidInstance)
	assert.Contains(t, err.Error(), "no room")
	assert.Empty(t, rr.order)
}

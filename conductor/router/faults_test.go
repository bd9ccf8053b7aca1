package router

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

// Short bounds so that hanging engines fail fast.
func shortTimeouts(c *Config) {
	c.PrefillTimeout = 300 * time.Millisecond
	c.DecodeTimeout = time.Second
	c.IdleTimeout = 300 * time.Millisecond
	c.MaxBodyBytes = 1 << 20
}

var goodBody = map[string]any{"model": "tiny", "prompt": []int{1, 2, 3}, "max_tokens": 2}

// Every failure answers an OpenAI error body with its status (the request's
// fault 4xx, admission 429, engines 502 or 504, nothing to route to 503),
// releases whatever load the request was counted for, and the router goes
// on serving: a good request right after succeeds.
func TestFailuresAnswerClearlyAndLeakNothing(t *testing.T) {
	chat := func(msgs any) map[string]any { return map[string]any{"model": "tiny", "messages": msgs} }
	cases := []struct {
		name      string
		method    string // POST when empty
		path      string // /v1/completions when empty
		body      any
		setup     func(h *harness, p, d *engine)
		status    int
		param     string // the field the error names, if any
		msg       string // a fragment of the message
		scheduled bool   // the request reached the scheduler
	}{
		// Malformed requests: nothing reaches the scheduler or an engine.
		{name: "body is not JSON", body: `{"prompt": [1,2`, status: 400, msg: "JSON object"},
		{name: "body is a JSON array", body: `[1,2,3]`, status: 400, msg: "JSON object"},
		{name: "body is null", body: `null`, status: 400, msg: "JSON object"},
		{name: "prompt missing", body: map[string]any{"model": "tiny"}, status: 400, param: "prompt"},
		{name: "prompt of the wrong type", body: map[string]any{"prompt": 12}, status: 400, param: "prompt"},
		{name: "empty id list", body: map[string]any{"prompt": []int{}}, status: 400, param: "prompt"},
		{name: "batch of two prompts", body: map[string]any{"prompt": []string{"a", "b"}}, status: 400, param: "prompt", msg: "one request per prompt"},
		{name: "stream not a bool", body: map[string]any{"prompt": "a", "stream": "yes"}, status: 400, param: "stream"},
		{name: "negative max_tokens", body: map[string]any{"prompt": "a", "max_tokens": -1}, status: 400, param: "max_tokens"},
		{name: "chat without messages", path: "/v1/chat/completions", body: chat([]any{}), status: 400, param: "messages"},
		{name: "body over the limit", body: `{"prompt":"` + strings.Repeat("a", 2<<20) + `"}`, status: 413},
		{name: "unknown route", path: "/v1/embeddings", body: goodBody, status: 404, msg: "no route"},
		{name: "wrong method", method: http.MethodGet, status: 405},

		// Tokenization failures.
		{name: "tokenize refuses the request", body: map[string]any{"model": "tiny", "prompt": "hello"},
			setup:  func(h *harness, p, d *engine) { p.tokenizeErr.Store(400); d.tokenizeErr.Store(400) },
			status: 400, msg: "standin tokenize failure"},
		{name: "tokenize fails on every engine", body: map[string]any{"model": "tiny", "prompt": "hello"},
			setup:  func(h *harness, p, d *engine) { p.tokenizeErr.Store(500); d.tokenizeErr.Store(500) },
			status: 502, msg: "tokenize on"},

		// Scheduling.
		{name: "admission rejects", body: goodBody,
			setup:  func(h *harness, p, d *engine) { h.rr.setReject(func(conductor.Request) bool { return true }) },
			status: 429, msg: "rejected"},
		{name: "no instance registered", body: goodBody,
			setup: func(h *harness, p, d *engine) {
				require.NoError(h.t, h.router.Remove("p0"))
				require.NoError(h.t, h.router.Remove("d0"))
			},
			status: 503, msg: "cannot schedule"},

		// Prefill failures: the decode instance is never called.
		{name: "prefill answers 500", body: goodBody, setup: func(h *harness, p, d *engine) { p.setFault(fault500) },
			status: 502, msg: "prefill on p0", scheduled: true},
		{name: "prefill answers 400", body: goodBody, setup: func(h *harness, p, d *engine) { p.setFault(fault400) },
			status: 400, msg: "standin says the request is bad", scheduled: true},
		{name: "prefill hangs", body: goodBody, setup: func(h *harness, p, d *engine) { p.setFault(faultHang) },
			status: 504, msg: "prefill on p0", scheduled: true},
		{name: "prefill answers garbage", body: goodBody, setup: func(h *harness, p, d *engine) { p.setFault(faultBadJSON) },
			status: 502, msg: "not JSON", scheduled: true},
		{name: "prefill instance is down", body: goodBody,
			setup: func(h *harness, p, d *engine) {
				require.NoError(h.t, h.router.Remove("p0"))
				require.NoError(h.t, h.router.Register(Instance{ID: "p0", Role: RolePrefill, URL: deadPort(h.t)}))
			},
			status: 502, msg: "connection refused", scheduled: true},

		// Decode failures before the answer started.
		{name: "decode answers 500", body: goodBody, setup: func(h *harness, p, d *engine) { d.setFault(fault500) },
			status: 502, msg: "decode on d0", scheduled: true},
		{name: "decode hangs, whole answer", body: goodBody, setup: func(h *harness, p, d *engine) { d.setFault(faultHang) },
			status: 504, msg: "decode on d0", scheduled: true},
		{name: "decode hangs before its stream", body: map[string]any{"prompt": []int{1}, "stream": true},
			setup:  func(h *harness, p, d *engine) { d.setFault(faultHang) },
			status: 504, msg: "no event for", scheduled: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, es := cluster(t, 1, 1)
			p, d := es[0], es[1]
			h := newHarness(t, nil, shortTimeouts, p, d)
			if tc.setup != nil {
				tc.setup(h, p, d)
			}
			a := h.do(cmp.Or(tc.method, http.MethodPost), cmp.Or(tc.path, "/v1/completions"), tc.body)
			require.Equal(t, tc.status, a.status, "%s", a.body)
			assert.Equal(t, "application/json", a.header.Get("Content-Type"))
			e := a.apiErr(t)
			assert.Contains(t, e.Message, tc.msg)
			if tc.param != "" {
				require.NotNil(t, e.Param)
				assert.Equal(t, tc.param, *e.Param)
			}
			h.rr.waitIdle(t)
			assert.Equal(t, tc.scheduled, h.rr.count() == 1, "reached the scheduler")
			if tc.status == http.StatusTooManyRequests {
				assert.Equal(t, 1.0, h.metric("mooncake_conductor_rejected_total"))
			}

			// The router keeps serving once the fault is gone.
			p.setFault(faultNone)
			d.setFault(faultNone)
			h.rr.setReject(nil)
			for _, x := range h.router.Instances() {
				require.NoError(t, h.router.Remove(x.ID))
			}
			require.NoError(t, h.router.Register(p.instance()))
			require.NoError(t, h.router.Register(d.instance()))
			a = h.do(http.MethodPost, "/v1/completions", goodBody)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			h.rr.waitIdle(t)
		})
	}
}

// A decode stream that breaks after the router answered 200 ends with an
// OpenAI error event and [DONE]: the client sees the events that came
// whole, then the error, never half an event and never a silent end.
func TestStreamBreaksMidway(t *testing.T) {
	cases := []struct {
		name   string
		fault  string
		events []string // the text of the events before the error
		code   int
		msg    string
	}{
		// The engine closes the connection after two events.
		{name: "connection closed", fault: faultCut, events: []string{"t0", "t1"}, code: 502, msg: "decode on d0"},
		// The engine goes silent after one event: the idle bound ends it.
		{name: "engine stalls", fault: faultStall, events: []string{"t0"}, code: 504, msg: "no event for"},
		// The engine ends its answer cleanly but without [DONE].
		{name: "no [DONE]", fault: faultNoDone, events: []string{"t0", "t1", "t2", "t3"}, code: 502, msg: "without data: [DONE]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, es := cluster(t, 1, 1)
			h := newHarness(t, nil, shortTimeouts, es...)
			es[1].setFault(tc.fault)
			a := h.do(http.MethodPost, "/v1/completions", map[string]any{"prompt": []int{1, 2}, "max_tokens": 4, "stream": true})
			require.Equal(t, http.StatusOK, a.status)
			evs := events(a.body)
			require.Len(t, evs, len(tc.events)+2, "%s", a.body)
			for i, want := range tc.events {
				assert.Contains(t, evs[i], `"text":"`+want+`"`)
			}
			var e errorBody
			require.NoError(t, json.Unmarshal([]byte(evs[len(evs)-2]), &e), evs[len(evs)-2])
			assert.Equal(t, tc.code, e.Error.Code)
			assert.Contains(t, e.Error.Message, tc.msg)
			assert.Equal(t, "[DONE]", evs[len(evs)-1])
			h.rr.waitIdle(t)
			outcome := outcomeEngineError
			if tc.code == 504 {
				outcome = outcomeTimeout
			}
			assert.Equal(t, 1.0, h.metric(`mooncake_conductor_requests_total{outcome="`+outcome+`",route="completions"}`))
			assert.Equal(t, 1.0, h.metric(`mooncake_conductor_engine_errors_total{instance="d0",phase="decode"}`))
		})
	}
}

// A client that goes away mid-stream cancels the decode call (the engine
// sees its caller leave) and the request's load is released.
func TestClientLeavesMidStream(t *testing.T) {
	_, es := cluster(t, 1, 1)
	d := es[1]
	h := newHarness(t, nil, func(c *Config) { c.IdleTimeout = time.Minute }, es...)
	d.setFault(faultStall)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/completions",
		strings.NewReader(`{"prompt":[1,2,3],"max_tokens":5,"stream":true}`))
	require.NoError(t, err)
	resp, err := h.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	require.NoError(t, err)
	require.Contains(t, string(buf[:n]), `"text":"t0"`, "the first event arrives before the stall")
	cancel()
	select {
	case <-d.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode engine never saw its caller leave")
	}
	h.rr.waitIdle(t)
}

// With one of two prefill instances down, concurrent requests (streamed
// and not) all get an answer: 200 through the live one, 502 naming the
// dead one for those scheduled there; none is lost, the load is released,
// and once the dead instance is removed every request succeeds.
func TestConcurrentRequestsWhileAnEngineIsDown(t *testing.T) {
	_, es := cluster(t, 1, 2)
	dead := Instance{ID: "p1", Role: RolePrefill, URL: deadPort(t)}
	h := newHarness(t, nil, shortTimeouts, es...)
	require.NoError(t, h.router.Register(dead))

	const n, workers = 40, 8
	type result struct {
		status  int
		prefill string
		text    string
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				body := map[string]any{"prompt": []int{i, i + 1}, "max_tokens": 2, "stream": i%2 == 0}
				a := h.do(http.MethodPost, "/v1/completions", body)
				results[i] = result{status: a.status, prefill: a.header.Get(HeaderPrefill), text: string(a.body)}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()

	ok, failed := 0, 0
	for i, r := range results {
		switch r.status {
		case http.StatusOK:
			ok++
			assert.Equal(t, "p0", r.prefill, "request %d", i)
			if i%2 == 0 {
				assert.Contains(t, r.text, "data: [DONE]")
				assert.NotContains(t, r.text, `"error"`)
			}
		case http.StatusBadGateway:
			failed++
			assert.Equal(t, "p1", r.prefill, "request %d", i)
			assert.Contains(t, r.text, "prefill on p1")
		default:
			t.Errorf("request %d: status %d: %s", i, r.status, r.text)
		}
	}
	assert.Equal(t, n, ok+failed)
	assert.Equal(t, n/2, failed, "round robin sends every other request to the dead instance")
	h.rr.waitIdle(t)
	assert.Equal(t, float64(n/2), h.metric(`mooncake_conductor_engine_errors_total{instance="p1",phase="prefill"}`))

	require.NoError(t, h.router.Remove("p1"))
	for i := range 4 {
		a := h.do(http.MethodPost, "/v1/completions", map[string]any{"prompt": []int{i}, "max_tokens": 1})
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	}
	h.rr.waitIdle(t)
	assert.Equal(t, float64(n/2+4), h.metric(`mooncake_conductor_requests_total{outcome="ok",route="completions"}`))
	assert.Equal(t, float64(n/2), h.metric(`mooncake_conductor_requests_total{outcome="engine_error",route="completions"}`))
}

// An engine's error message survives into the client's error, whatever
// shape the engine wrote it in.
func TestEngineMessage(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		// OpenAI and current vLLM.
		{"openai", `{"error":{"message":"too long","type":"BadRequestError","code":400}}`, "too long"},
		// Older vLLM.
		{"vllm flat", `{"object":"error","message":"bad model","code":404}`, "bad model"},
		// FastAPI validation.
		{"fastapi detail string", `{"detail":"Not Found"}`, "Not Found"},
		{"fastapi detail list", `{"detail":[{"loc":["body"]}]}`, `[{"loc":["body"]}]`},
		// A string error.
		{"error string", `{"error":"boom"}`, "boom"},
		// Not JSON at all: the text, cut short.
		{"plain text", "Internal Server Error", "Internal Server Error"},
		{"long text", strings.Repeat("x", 600), strings.Repeat("x", 512) + "..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, engineMessage([]byte(tc.body)))
		})
	}
}

// Status codes map to the outcome labels and error types clients see.
func TestOutcomes(t *testing.T) {
	cases := []struct {
		status  int
		outcome string
		typ     string
	}{
		{200, outcomeOK, ""},
		{400, outcomeBadRequest, "invalid_request_error"},
		{404, outcomeBadRequest, "invalid_request_error"},
		{429, outcomeRejected, "rate_limit_error"},
		{502, outcomeEngineError, "server_error"},
		{503, outcomeUnavailable, "server_error"},
		{504, outcomeTimeout, "server_error"},
		{statusClientClosed, outcomeCanceled, "invalid_request_error"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			assert.Equal(t, tc.outcome, outcomeFor(tc.status))
			if tc.typ != "" {
				assert.Equal(t, tc.typ, newErrorBody(tc.status, "m", "").Error.Type)
			}
		})
	}
}

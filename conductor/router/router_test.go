package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ids(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i * 7 % 1000
	}
	return out
}

// Every OpenAI request goes to a prefill stand-in as a one-token,
// non-streamed completion with kv_transfer_params {do_remote_decode}, then
// to a decode stand-in with the parameters the prefill answered with (or,
// for MooncakeConnector prefill instances, the transfer_id and bootstrap
// address), and the decode's answer comes back to the client, streamed or
// whole. The stand-ins refuse (and fail the test) any request that breaks
// the protocol.
func TestRoutesThroughPrefillThenDecode(t *testing.T) {
	cases := []struct {
		name     string
		mooncake bool // prefill answers without kv_transfer_params
		path     string
		body     map[string]any
		stream   bool
		want     string // the generated text
		tokens   int    // prompt length the scheduler is told
		output   int    // output length the scheduler is told
		check    func(t *testing.T, p, d *engine)
	}{
		{
			// Prompt as token ids: no /tokenize; two full blocks hashed.
			name: "completion of token ids, whole answer",
			path: "/v1/completions", body: map[string]any{"model": "tiny", "prompt": ids(1100), "max_tokens": 4},
			want: "t0t1t2t3", tokens: 1100, output: 4,
			check: func(t *testing.T, p, d *engine) {
				assert.Len(t, p.lastBody()["prompt"], 1100, "the prompt reaches the prefill unchanged")
				assert.Equal(t, float64(4), d.lastBody()["max_tokens"], "decode keeps the client's max_tokens")
			},
		},
		{
			// A text prompt is tokenized by an engine; stream_options and
			// min_tokens go to decode only.
			name: "completion of text, streamed",
			path: "/v1/completions",
			body: map[string]any{"model": "tiny", "prompt": strings.Repeat("a", 600), "max_tokens": 3, "stream": true,
				"stream_options": map[string]any{"include_usage": true}, "min_tokens": 2},
			stream: true, want: "t0t1t2", tokens: 600, output: 3,
			check: func(t *testing.T, p, d *engine) {
				assert.NotNil(t, d.lastBody()["stream_options"])
				assert.Equal(t, float64(2), d.lastBody()["min_tokens"])
				assert.Equal(t, true, d.lastBody()["stream"])
			},
		},
		{
			// A batch of one prompt is that prompt.
			name: "completion of a batch of one id list",
			path: "/v1/completions", body: map[string]any{"model": "tiny", "prompt": [][]int{ids(10)}, "max_tokens": 2},
			want: "t0t1", tokens: 10, output: 2,
		},
		{
			// Chat: /tokenize gets the messages (the engine applies the
			// template); max_completion_tokens is capped to 1 on prefill
			// and kept on decode.
			name: "chat, streamed, max_completion_tokens",
			path: "/v1/chat/completions",
			body: map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": "hello"}},
				"max_completion_tokens": 5, "stream": true},
			stream: true, want: "t0t1t2t3t4", tokens: len("user:hello\n"), output: 5,
			check: func(t *testing.T, p, d *engine) {
				assert.Equal(t, float64(5), d.lastBody()["max_completion_tokens"])
			},
		},
		{
			// No max_tokens: output 0 leaves the guess to the scheduler.
			name: "chat, whole answer, default output",
			path: "/v1/chat/completions",
			body: map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": "hi"}}},
			want: "t0t1t2", tokens: len("user:hi\n"), output: 0,
		},
		{
			// MooncakeConnector: the prefill answers no kv_transfer_params;
			// decode gets do_remote_prefill with the transfer_id the prefill
			// was given, its engine id and bootstrap address.
			name: "mooncake connector prefill, streamed", mooncake: true,
			path:   "/v1/completions",
			body:   map[string]any{"model": "tiny", "prompt": ids(20), "max_tokens": 2, "stream": true},
			stream: true, want: "t0t1", tokens: 20, output: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, es := cluster(t, 1, 1)
			p, d := es[0], es[1]
			if tc.mooncake {
				p.mooncake, p.engineID, p.boot = true, "engine-p0", "http://127.0.0.1:8998"
			}
			h := newHarness(t, nil, nil, p, d)
			a := h.do(http.MethodPost, tc.path, tc.body)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			assert.Equal(t, "p0", a.header.Get(HeaderPrefill))
			assert.Equal(t, "d0", a.header.Get(HeaderDecode))
			assert.NotEmpty(t, a.header.Get(HeaderRequestID))
			assert.Equal(t, tc.want, generated(t, a, tc.stream))
			h.rr.waitIdle(t)
			require.Equal(t, 1, h.rr.count())
			got := h.rr.scheduled[0]
			assert.Equal(t, tc.tokens, got.Tokens)
			assert.Equal(t, tc.output, got.Output)
			assert.Len(t, got.Blocks, tc.tokens/512)
			assert.Equal(t, a.header.Get(HeaderRequestID), got.ID)
			if tc.check != nil {
				tc.check(t, p, d)
			}
			route := "completions"
			if strings.Contains(tc.path, "chat") {
				route = "chat_completions"
			}
			assert.Equal(t, 1.0, h.metric(`mooncake_conductor_requests_total{outcome="ok",route="`+route+`"}`))
			if tc.stream {
				assert.Equal(t, 1.0, h.metric(`mooncake_conductor_ttft_seconds_count{route="`+route+`"}`), "TTFT observed for a stream")
			}
		})
	}
}

// generated is the text of an answer: the concatenated deltas of a stream
// that ends in [DONE], or the whole answer's text.
func generated(t *testing.T, a answer, stream bool) string {
	t.Helper()
	type choice struct {
		Text    string `json:"text"`
		Delta   struct{ Content string }
		Message struct{ Content string }
	}
	var out strings.Builder
	if !stream {
		var v struct{ Choices []choice }
		require.NoError(t, json.Unmarshal(a.body, &v), "%s", a.body)
		require.Len(t, v.Choices, 1)
		return v.Choices[0].Text + v.Choices[0].Message.Content
	}
	assert.True(t, strings.HasPrefix(a.header.Get("Content-Type"), "text/event-stream"))
	evs := events(a.body)
	require.NotEmpty(t, evs)
	require.Equal(t, "[DONE]", evs[len(evs)-1], "stream ends with [DONE]: %s", a.body)
	for _, ev := range evs[:len(evs)-1] {
		var v struct{ Choices []choice }
		require.NoError(t, json.Unmarshal([]byte(ev), &v), ev)
		for _, c := range v.Choices {
			out.WriteString(c.Text + c.Delta.Content)
		}
	}
	return out.String()
}

// A failing /tokenize is skipped for the next engine; the client's
// credentials reach every engine call.
func TestTokenizeFallsOverAndCredentialsPass(t *testing.T) {
	_, es := cluster(t, 2, 1)
	h := newHarness(t, nil, nil, es...)
	es[0].tokenizeErr.Store(http.StatusInternalServerError)
	for i := range 4 {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/completions",
			strings.NewReader(`{"model":"tiny","prompt":"hello","max_tokens":1}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk-test")
		resp, err := h.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
	}
	h.rr.waitIdle(t)
	for _, e := range es {
		assert.Equal(t, "Bearer sk-test", e.auth(), e.id)
	}
	assert.Equal(t, 2.0, h.metric(`mooncake_conductor_engine_errors_total{instance="p0",phase="tokenize"}`),
		"p0 is asked first every other request")
}

// encodeFields writes what json.Marshal writes of compact values.
func TestEncodeFields(t *testing.T) {
	m := map[string]json.RawMessage{"prompt": json.RawMessage(`"a \"b\""`), "max_tokens": json.RawMessage(`1`),
		"k\"ey": json.RawMessage(`{"x":[1,2]}`), "none": nil}
	want, err := json.Marshal(m)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(encodeFields(m)))
	assert.Equal(t, "{}", string(encodeFields(nil)))
}

package router

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/blockhash"
)

// Routes (the route label of the metrics) and the engine path each maps to.
const (
	routeCompletions = "completions"
	routeChat        = "chat_completions"
)

func enginePath(route string) string {
	if route == routeChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Phases of a request, as the engine_errors metric and messages name them.
const (
	phaseTokenize = "tokenize"
	phasePrefill  = "prefill"
	phaseDecode   = "decode"
	phaseModels   = "models"
)

// Response headers that tell the client where its request went.
const (
	HeaderRequestID = "X-Request-Id"
	HeaderPrefill   = "X-Conductor-Prefill"
	HeaderDecode    = "X-Conductor-Decode"
)

// inference is one parsed OpenAI request.
type inference struct {
	route  string
	fields map[string]json.RawMessage // the client's body, kept whole
	stream bool
	// output is max_completion_tokens or max_tokens; 0 when unset.
	output int
	// ids is the prompt when the client gave it as token ids; otherwise
	// tokenize is the body of the engine's /tokenize.
	ids      []int
	tokenize map[string]json.RawMessage
	// extra is what the engine hashes into the prompt's blocks beside
	// its tokens: the request's cache_salt, its LoRA adapter.
	extra blockhash.Extra
}

// inference returns the handler of an OpenAI route: it counts the request
// in the metrics whatever becomes of it.
func (r *Router) inference(route string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		r.inflight.Add(1)
		r.metrics.inflight.Inc()
		outcome := r.serve(w, req, route, start)
		r.inflight.Add(-1)
		r.metrics.inflight.Dec()
		r.metrics.requests.WithLabelValues(route, outcome).Inc()
		r.metrics.e2e.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// serve routes one request: token ids, schedule, prefill, decode. It
// answers the client on every path and returns the outcome.
func (r *Router) serve(w http.ResponseWriter, req *http.Request, route string, start time.Time) string {
	fail := func(e *apiError) string {
		writeError(w, e)
		return e.outcome
	}
	body, e := readBody(w, req, r.cfg.MaxBodyBytes)
	if e != nil {
		return fail(e)
	}
	in, e := parseInference(route, body, r.cfg.LoRAModules)
	if e != nil {
		return fail(e)
	}
	id := uuid.NewString()
	tokens, e := r.tokens(req, in, id)
	if e != nil {
		return fail(e)
	}
	dec, e := r.schedule(id, in, tokens)
	if e != nil {
		return fail(e)
	}
	// From here the scheduler counts the request's load on two instances:
	// release it however the request ends.
	t := &ticket{r: r, id: id}
	defer t.finish()
	pin, okP := r.instance(dec.Prefill)
	din, okD := r.instance(dec.Decode)
	if !okP || !okD {
		return fail(errorf(http.StatusServiceUnavailable, "scheduled onto %s and %s, no longer both registered", dec.Prefill, dec.Decode))
	}
	w.Header().Set(HeaderRequestID, id)
	w.Header().Set(HeaderPrefill, pin.ID)
	w.Header().Set(HeaderDecode, din.ID)

	kv, e := r.prefill(req, pin, in, id)
	t.prefillDone()
	if e != nil {
		return fail(e)
	}
	if len(kv) == 0 {
		kv = pullParams(pin, id)
	}
	return r.decode(w, req, din, in, id, kv, start)
}

// ticket releases a scheduled request's load exactly once per phase:
// prefillDone when the prefill ends, finish (deferred) when the request
// does.
type ticket struct {
	r         *Router
	id        string
	prefilled bool
}

func (t *ticket) prefillDone() {
	if t.prefilled {
		return
	}
	t.prefilled = true
	t.r.schedMu.Lock()
	t.r.sched.PrefillDone(t.r.now(), t.id)
	t.r.schedMu.Unlock()
}

func (t *ticket) finish() {
	t.prefillDone()
	t.r.schedMu.Lock()
	t.r.sched.DecodeDone(t.r.now(), t.id)
	t.r.schedMu.Unlock()
}

func (r *Router) schedule(id string, in *inference, tokens []int) (conductor.Decision, *apiError) {
	// Output zero (no max_tokens) leaves the guess to the scheduler's
	// DefaultOutput.
	cr := conductor.Request{ID: id, Tokens: len(tokens), Output: in.output, Blocks: blockhash.BlocksFor(r.scheme, nil, tokens, in.extra)}
	r.schedMu.Lock()
	dec, err := r.sched.Schedule(r.now(), cr)
	r.schedMu.Unlock()
	switch {
	case errors.Is(err, conductor.ErrRejected):
		r.metrics.rejected.Inc()
		return dec, errorf(http.StatusTooManyRequests, "%v", err)
	case err != nil:
		return dec, errorf(http.StatusServiceUnavailable, "cannot schedule: %v", err)
	}
	r.metrics.reused.Add(float64(dec.Reused))
	r.cfg.Logger.Debug("router: scheduled", "request", id, "prefill", dec.Prefill, "decode", dec.Decode,
		"blocks", len(cr.Blocks), "reused", dec.Reused, "pulled", dec.Pulled, "source", dec.Source, "ttft", dec.TTFT)
	return dec, nil
}

// parseInference checks the fields the router reads and keeps the body
// whole for the engines: they validate the rest.
func parseInference(route string, body []byte, lora map[string]string) (*inference, *apiError) {
	in := &inference{route: route}
	if err := json.Unmarshal(body, &in.fields); err != nil || in.fields == nil {
		return nil, errorf(http.StatusBadRequest, "the body must be a JSON object: %v", cmpErr(err, "null"))
	}
	if raw, ok := present(in.fields, "stream"); ok {
		if err := json.Unmarshal(raw, &in.stream); err != nil {
			return nil, badParam("stream", "stream must be true or false")
		}
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		raw, ok := present(in.fields, k)
		if !ok {
			continue
		}
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return nil, badParam(k, "%s must be a non-negative integer", k)
		}
		if in.output == 0 || k == "max_completion_tokens" {
			in.output = n
		}
	}
	if e := in.parseExtra(lora); e != nil {
		return nil, e
	}
	if route == routeChat {
		return in, parseChat(in)
	}
	return in, parseCompletion(in)
}

// parseExtra reads what the engine hashes into the prompt's blocks: the
// request's cache_salt and, when its model names one of lora's adapters,
// that adapter. A salt the engine would refuse is refused here too.
func (in *inference) parseExtra(lora map[string]string) *apiError {
	if raw, ok := present(in.fields, "cache_salt"); ok && string(bytes.TrimSpace(raw)) != "null" {
		if err := json.Unmarshal(raw, &in.extra.CacheSalt); err != nil {
			return badParam("cache_salt", "cache_salt must be a string")
		}
		if in.extra.CacheSalt == "" {
			return badParam("cache_salt", "cache_salt must be a non-empty string")
		}
	}
	if raw, ok := present(in.fields, "model"); ok && len(lora) > 0 {
		var model string
		if json.Unmarshal(raw, &model) == nil {
			if path, ok := lora[model]; ok {
				in.extra.LoRAName, in.extra.LoRAPath = model, path
			}
		}
	}
	if err := in.extra.Validate(); err != nil {
		return badParam("cache_salt", "%v", err)
	}
	return nil
}

// parseCompletion reads the prompt of /v1/completions: a string, token
// ids, or a batch of one of either. A batch of several prompts is refused:
// each prompt needs its own prefill/decode pair and KV transfer.
func parseCompletion(in *inference) *apiError {
	raw, ok := present(in.fields, "prompt")
	if !ok {
		return badParam("prompt", "prompt is required")
	}
	if isString(raw) {
		in.setTokenize("prompt", raw)
		return nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return badParam("prompt", "prompt is an empty list of token ids")
		}
		in.ids = ids
		return nil
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) != nil {
		return badParam("prompt", "prompt must be a string, a list of token ids, or a list of one of them")
	}
	if len(batch) != 1 {
		return badParam("prompt", "batches of %d prompts are not routed: send one request per prompt", len(batch))
	}
	if isString(batch[0]) {
		in.setTokenize("prompt", batch[0])
		return nil
	}
	if json.Unmarshal(batch[0], &ids) == nil && len(ids) > 0 {
		in.ids = ids
		return nil
	}
	return badParam("prompt", "prompt must be a string, a list of token ids, or a list of one of them")
}

// parseChat checks messages; the engine's /tokenize applies the chat
// template, so the fields that shape the templated prompt go with them.
func parseChat(in *inference) *apiError {
	raw, ok := present(in.fields, "messages")
	if !ok || !isNonEmptyList(raw) {
		return badParam("messages", "messages must be a non-empty list")
	}
	in.setTokenize("messages", raw)
	for _, k := range []string{"add_generation_prompt", "continue_final_message",
		"chat_template", "chat_template_kwargs", "tools", "documents", "mm_processor_kwargs"} {
		if v, ok := present(in.fields, k); ok {
			in.tokenize[k] = v
		}
	}
	return nil
}

func (in *inference) setTokenize(key string, v json.RawMessage) {
	in.tokenize = map[string]json.RawMessage{key: v}
	for _, k := range []string{"model", "add_special_tokens"} {
		if v, ok := present(in.fields, k); ok {
			in.tokenize[k] = v
		}
	}
}

// encodeFields writes a request body as json.Marshal would, keys sorted,
// but copies the values as they are: they are valid JSON already (they
// were decoded from the client's body or written by the router), and
// json.Marshal would scan every byte of the prompt again to compact it.
func encodeFields(m map[string]json.RawMessage) []byte {
	n := 2
	for k, v := range m {
		n += len(k) + len(v) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		key, _ := json.Marshal(k)
		b = append(append(b, key...), ':')
		if v := m[k]; len(v) > 0 {
			b = append(b, v...)
		} else {
			b = append(b, "null"...)
		}
	}
	return append(b, '}')
}

// isString and isNonEmptyList tell the type of a valid JSON value from its
// first bytes, without decoding a prompt the router only passes on.
func isString(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '"'
}

func isNonEmptyList(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 2 && v[0] == '[' && len(bytes.TrimSpace(v[1:len(v)-1])) > 0
}

// present returns a field that is set and not null.
func present(m map[string]json.RawMessage, k string) (json.RawMessage, bool) {
	v, ok := m[k]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return nil, false
	}
	return v, true
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}

// tokens returns the prompt's token ids: as given, or from an engine's
// /tokenize (vLLM: POST /tokenize {model, prompt | messages} -> {tokens}).
// An engine that fails is skipped for the next, up to three; one that
// answers 4xx speaks for the request and ends the search.
func (r *Router) tokens(req *http.Request, in *inference, id string) ([]int, *apiError) {
	if in.ids != nil {
		return in.ids, nil
	}
	var prefill, decode []Instance
	for _, x := range r.Instances() {
		if x.Role == RolePrefill {
			prefill = append(prefill, x)
		} else {
			decode = append(decode, x)
		}
	}
	if len(prefill)+len(decode) == 0 {
		return nil, errorf(http.StatusServiceUnavailable, "no instance registered to tokenize with")
	}
	// Prefill instances first, from a rotating start: the API servers of
	// decode instances are busy streaming tokens at a pace (TBT) the
	// scheduler promised.
	if len(prefill) > 0 {
		k := int(r.tokenizeNext.Add(1) % uint64(len(prefill)))
		prefill = append(prefill[k:], prefill[:k]...)
	}
	cands := append(prefill, decode...)
	body := encodeFields(in.tokenize)
	var last *apiError
	for _, x := range cands[:min(len(cands), 3)] {
		b, _, e := r.call(req, id, x, phaseTokenize, http.MethodPost, "/tokenize", body)
		if e == nil {
			var ans struct {
				Tokens []int `json:"tokens"`
			}
			if err := json.Unmarshal(b, &ans); err != nil || ans.Tokens == nil {
				last = r.engineBroken(x, phaseTokenize, "answer has no token list: %.200s", b)
				continue
			}
			return ans.Tokens, nil
		}
		if last = e; e.status < 500 {
			break
		}
	}
	return nil, last
}

// prefillParams are the kv_transfer_params of a prefill request as vLLM's
// disaggregated-serving proxies send them: compute the prompt, keep its
// KV for a remote decode. NIXL-style connectors answer with the
// parameters the decode instance needs; MooncakeConnector needs
// transfer_id, which the decode request then repeats.
type prefillParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TransferID      string  `json:"transfer_id"`
}

// pullParams are the decode request's kv_transfer_params when the prefill
// answer carried none (vLLM's MooncakeConnector): pull the KV of
// transfer_id from the prefill instance's bootstrap server.
func pullParams(p Instance, id string) json.RawMessage {
	b, _ := json.Marshal(struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		TransferID      string `json:"transfer_id"`
		RemoteEngineID  string `json:"remote_engine_id,omitempty"`
		RemoteBootstrap string `json:"remote_bootstrap_addr,omitempty"`
	}{true, false, id, p.EngineID, p.Bootstrap})
	return b
}

// prefill sends the request to the prefill instance as a one-token,
// non-streamed completion and returns the kv_transfer_params it answers
// with (nil when none).
func (r *Router) prefill(req *http.Request, p Instance, in *inference, id string) (json.RawMessage, *apiError) {
	body := maps.Clone(in.fields)
	body["stream"] = json.RawMessage("false")
	body["max_tokens"] = json.RawMessage("1")
	if _, ok := body["max_completion_tokens"]; ok {
		body["max_completion_tokens"] = json.RawMessage("1")
	}
	// A non-streamed request may not carry stream_options, and a lower
	// bound on the output length cannot hold at one token.
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(body, k)
	}
	kv, _ := json.Marshal(prefillParams{DoRemoteDecode: true, TransferID: id})
	body["kv_transfer_params"] = kv
	raw := encodeFields(body)

	start := time.Now()
	b, _, e := r.call(req, id, p, phasePrefill, http.MethodPost, enginePath(in.route), raw)
	if e != nil {
		return nil, e
	}
	r.metrics.prefill.WithLabelValues(p.ID).Observe(time.Since(start).Seconds())
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, r.engineBroken(p, phasePrefill, "answer is not JSON: %v", err)
	}
	if v := bytes.TrimSpace(ans.KV); len(v) == 0 || bytes.Equal(v, []byte("null")) || bytes.Equal(v, []byte("{}")) {
		return nil, nil
	}
	return ans.KV, nil
}

// decode sends the client's request, with kv, to the decode instance and
// relays the answer. Once a stream has started the status is sent, so a
// failure then ends the stream with an error event and [DONE].
func (r *Router) decode(w http.ResponseWriter, req *http.Request, d Instance, in *inference, id string, kv json.RawMessage, start time.Time) string {
	body := maps.Clone(in.fields)
	body["kv_transfer_params"] = kv
	raw := encodeFields(body)

	ctx, cancel := context.WithTimeout(req.Context(), r.cfg.DecodeTimeout)
	defer cancel()
	// A non-streamed answer comes whole at the end of the generation, so
	// only streams have an idle bound; the timer cancels the call.
	var idle atomic.Bool
	var timer *time.Timer
	if in.stream {
		timer = time.AfterFunc(r.cfg.IdleTimeout, func() { idle.Store(true); cancel() })
		defer timer.Stop()
	}
	fail := func(err error) *apiError {
		if idle.Load() && req.Context().Err() == nil {
			return r.engineTimeout(d, phaseDecode, "no event for %v", r.cfg.IdleTimeout)
		}
		return r.engineFailure(ctx, req.Context(), d, phaseDecode, r.cfg.DecodeTimeout, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL+enginePath(in.route), bytes.NewReader(raw))
	if err != nil {
		return finishWith(w, r.engineBroken(d, phaseDecode, "%v", err))
	}
	hreq.Header = r.engineHeader(req, id)
	resp, err := r.client.Do(hreq)
	if err != nil {
		return finishWith(w, fail(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return finishWith(w, r.engineStatus(d, phaseDecode, resp.StatusCode, b))
	}
	if !in.stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, defaultMaxResponseBytes+1))
		switch {
		case err != nil:
			return finishWith(w, fail(err))
		case len(b) > defaultMaxResponseBytes:
			return finishWith(w, r.engineBroken(d, phaseDecode, "answer over %d bytes", defaultMaxResponseBytes))
		}
		w.Header().Set("Content-Type", cmp.Or(resp.Header.Get("Content-Type"), "application/json"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
		return outcomeOK
	}
	timer.Reset(r.cfg.IdleTimeout)
	w.Header().Set("Content-Type", cmp.Or(resp.Header.Get("Content-Type"), "text/event-stream"))
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	return r.relay(w, rc, resp.Body, timer, in.route, start, fail)
}

// relay copies a server-sent-event stream to the client an event at a
// time (a client never sees half an event) and checks that it ends with
// "data: [DONE]", as every vLLM stream does: an engine that closes early
// is a failure, not the end of the answer.
func (r *Router) relay(w http.ResponseWriter, rc *http.ResponseController, body io.Reader, timer *time.Timer,
	route string, start time.Time, fail func(error) *apiError) string {
	br := bufio.NewReaderSize(body, 32<<10)
	var event []byte
	first, done := true, false
	for {
		line, err := br.ReadSlice('\n')
		event = append(event, line...)
		if len(line) > 0 {
			timer.Reset(r.cfg.IdleTimeout)
		}
		if err == bufio.ErrBufferFull {
			if len(event) > defaultMaxEventBytes {
				err = fmt.Errorf("an event over %d bytes", defaultMaxEventBytes)
			} else {
				continue
			}
		}
		if err == nil && len(bytes.TrimRight(line, "\r\n")) > 0 {
			continue // inside an event
		}
		if err == io.EOF && len(bytes.TrimSpace(event)) > 0 {
			// The last event may lack its blank line.
			event = append(event, "\n\n"...)
			err = nil
		}
		if err == nil && len(bytes.TrimSpace(event)) == 0 {
			event = event[:0] // blank lines between events say nothing
			continue
		}
		if err == nil {
			last := isDone(event)
			done = done || last
			if _, werr := w.Write(event); werr != nil {
				return outcomeCanceled
			}
			// [DONE] goes out when the handler returns, after the
			// scheduler and the metrics counted the request: a client
			// that saw its answer end sees them too.
			if !last {
				_ = rc.Flush()
			}
			if first {
				r.metrics.ttft.WithLabelValues(route).Observe(time.Since(start).Seconds())
				first = false
			}
			event = event[:0]
			continue
		}
		if done {
			return outcomeOK // whatever follows [DONE] changes nothing
		}
		if err == io.EOF {
			err = errors.New("the stream ended without data: [DONE]")
		}
		e := fail(err)
		if e.status == statusClientClosed {
			return e.outcome
		}
		_, _ = w.Write(sseError(e))
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
		return e.outcome
	}
}

func isDone(event []byte) bool {
	v, ok := bytes.CutPrefix(bytes.TrimSpace(event), []byte("data:"))
	return ok && bytes.Equal(bytes.TrimSpace(v), []byte("[DONE]"))
}

func finishWith(w http.ResponseWriter, e *apiError) string {
	writeError(w, e)
	return e.outcome
}

// engineHeader is the header of a request to an engine: JSON, the
// client's credentials (engines may run with --api-key) and the request
// ID, the same for tokenize, prefill and decode so engine logs line up.
func (r *Router) engineHeader(req *http.Request, id string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if a := req.Header.Get("Authorization"); a != "" {
		h.Set("Authorization", a)
	}
	h.Set(HeaderRequestID, id)
	return h
}

// call sends one request of the client's request creq, as request id, to
// an engine and reads its whole answer: a call that should answer quickly
// (tokenize, prefill, models), bounded by PrefillTimeout.
func (r *Router) call(creq *http.Request, id string, x Instance, phase, method, path string, body []byte) ([]byte, int, *apiError) {
	client := creq.Context()
	limit := r.cfg.PrefillTimeout
	ctx, cancel := context.WithTimeout(client, limit)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, x.URL+path, rd)
	if err != nil {
		return nil, 0, r.engineBroken(x, phase, "%v", err)
	}
	req.Header = r.engineHeader(creq, id)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, 0, r.engineFailure(ctx, client, x, phase, limit, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, defaultMaxResponseBytes+1))
	if err != nil {
		return nil, 0, r.engineFailure(ctx, client, x, phase, limit, err)
	}
	if len(b) > defaultMaxResponseBytes {
		return nil, 0, r.engineBroken(x, phase, "answer over %d bytes", defaultMaxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		return nil, 0, r.engineStatus(x, phase, resp.StatusCode, b)
	}
	return b, resp.StatusCode, nil
}

// engineFailure classifies a failed engine call: the client went away
// (nothing to answer), the call's deadline passed (504), or the engine
// failed (502).
func (r *Router) engineFailure(ctx, client context.Context, x Instance, phase string, limit time.Duration, err error) *apiError {
	switch {
	case client.Err() != nil:
		return &apiError{status: statusClientClosed, outcome: outcomeCanceled, msg: "client went away"}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return r.engineTimeout(x, phase, "no answer within %v", limit)
	}
	return r.engineBroken(x, phase, "%v", err)
}

func (r *Router) engineTimeout(x Instance, phase, format string, args ...any) *apiError {
	r.metrics.engineErr.WithLabelValues(x.ID, phase).Inc()
	e := errorf(http.StatusGatewayTimeout, "%s on %s (%s) timed out: %s", phase, x.ID, x.URL, fmt.Sprintf(format, args...))
	r.cfg.Logger.Warn("router: engine timed out", "instance", x.ID, "phase", phase, "err", e.msg)
	return e
}

func (r *Router) engineBroken(x Instance, phase, format string, args ...any) *apiError {
	r.metrics.engineErr.WithLabelValues(x.ID, phase).Inc()
	e := errorf(http.StatusBadGateway, "%s on %s (%s) failed: %s", phase, x.ID, x.URL, fmt.Sprintf(format, args...))
	r.cfg.Logger.Warn("router: engine failed", "instance", x.ID, "phase", phase, "err", e.msg)
	return e
}

// engineStatus maps an engine's error answer: a 4xx is the request's
// fault and keeps its status, anything else is the engine's (502).
func (r *Router) engineStatus(x Instance, phase string, status int, body []byte) *apiError {
	msg := engineMessage(body)
	if status >= 400 && status < 500 {
		return errorf(status, "%s on %s answered %d: %s", phase, x.ID, status, msg)
	}
	return r.engineBroken(x, phase, "answered %d: %s", status, msg)
}

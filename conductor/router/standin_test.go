package router

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/internal/nettest"
)

// Faults a stand-in engine can be told to show on its completion routes.
const (
	faultNone    = ""
	faultHang    = "hang"    // never answer (until the caller gives up)
	fault500     = "500"     // answer 500 with an OpenAI error body
	fault400     = "400"     // answer 400: the request's fault
	faultCut     = "cut"     // stream two events, then close the connection
	faultStall   = "stall"   // stream one event, then go silent
	faultNoDone  = "nodone"  // stream events and end cleanly without [DONE]
	faultBadJSON = "badjson" // answer 200 with a body that is not JSON
)

// ledger is what the prefill stand-ins told the decode stand-ins, by
// X-Request-Id: the decode side checks it got what vLLM's protocol says.
type ledger struct {
	mu      sync.Mutex
	prefill map[string]prefillRecord
}

type prefillRecord struct {
	engine   *engine
	transfer string          // the transfer_id the prefill request carried
	issued   json.RawMessage // the kv_transfer_params it answered with; nil for none
}

func (l *ledger) put(id string, rec prefillRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prefill[id] = rec
}

func (l *ledger) get(id string) (prefillRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec, ok := l.prefill[id]
	return rec, ok
}

// engine is a stand-in vLLM OpenAI server (vllm serve with a KV connector):
// /tokenize, /v1/completions, /v1/chat/completions and /v1/models on a
// real socket. As a prefill instance it insists on max_tokens=1, no stream
// and kv_transfer_params {do_remote_decode: true, transfer_id}, and answers
// with the kv_transfer_params its decode peer needs (NIXL style) or none
// (mooncake, vLLM's MooncakeConnector). As a decode instance it insists on
// the parameters its prefill peer issued, then streams "t0", "t1", ... as
// server-sent events ending in data: [DONE], or answers whole.
type engine struct {
	t        *testing.T
	id, role string
	ledger   *ledger
	srv      *httptest.Server
	mooncake bool
	engineID string // mooncake: what remote_engine_id must be
	boot     string // mooncake: what remote_bootstrap_addr must be

	fault       atomic.Value // string, one of the faults
	tokenizeErr atomic.Int32 // status /tokenize answers with; 0: tokenize
	calls       atomic.Int32 // completion requests received
	health      atomic.Int32 // status GET /health answers with; 0: 200
	probes      atomic.Int32 // GET /health requests received
	canceled    chan string  // request IDs whose caller went away mid-answer

	mu       sync.Mutex
	last     map[string]any // the last completion body received
	lastAuth string         // and its Authorization header
}

func newEngine(t *testing.T, l *ledger, id, role string) *engine {
	e := &engine{t: t, id: id, role: role, ledger: l, canceled: make(chan string, 64)}
	e.fault.Store(faultNone)
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) setFault(f string) { e.fault.Store(f) }

func (e *engine) instance() Instance {
	return Instance{ID: e.id, Role: e.role, URL: e.srv.URL, EngineID: e.engineID, Bootstrap: e.boot}
}

func (e *engine) lastBody() map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

func (e *engine) auth() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastAuth
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		e.probes.Add(1)
		w.WriteHeader(cmp.Or(int(e.health.Load()), http.StatusOK))
	case "/tokenize":
		e.tokenize(w, r)
	case "/v1/models":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{"id": "tiny", "object": "model"}}})
	case "/v1/completions", "/v1/chat/completions":
		e.calls.Add(1)
		e.complete(w, r)
	default:
		http.NotFound(w, r)
	}
}

// tokenize gives one token per byte of the prompt, or of "role:content\n"
// per chat message.
func (e *engine) tokenize(w http.ResponseWriter, r *http.Request) {
	if s := e.tokenizeErr.Load(); s != 0 {
		writeJSON(w, int(s), newErrorBody(int(s), "standin tokenize failure", ""))
		return
	}
	var q struct {
		Prompt   *string `json:"prompt"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		writeJSON(w, http.StatusBadRequest, newErrorBody(400, err.Error(), ""))
		return
	}
	var text string
	switch {
	case q.Prompt != nil:
		text = *q.Prompt
	case q.Messages != nil:
		for _, m := range q.Messages {
			text += m.Role + ":" + m.Content + "\n"
		}
	default:
		writeJSON(w, http.StatusBadRequest, newErrorBody(400, "tokenize: no prompt or messages", ""))
		return
	}
	toks := make([]int, len(text))
	for i := range text {
		toks[i] = int(text[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": 1 << 20, "tokens": toks})
}

// refuse answers 400 for a protocol violation and fails the test.
func (e *engine) refuse(w http.ResponseWriter, format string, args ...any) {
	msg := fmt.Sprintf("standin %s: ", e.id) + fmt.Sprintf(format, args...)
	e.t.Error(msg)
	writeJSON(w, http.StatusBadRequest, newErrorBody(400, msg, ""))
}

func (e *engine) complete(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		e.refuse(w, "body is not JSON: %v", err)
		return
	}
	e.mu.Lock()
	e.last, e.lastAuth = body, r.Header.Get("Authorization")
	e.mu.Unlock()
	rid := r.Header.Get(HeaderRequestID)
	if rid == "" {
		e.refuse(w, "no %s header", HeaderRequestID)
		return
	}
	kv, _ := body["kv_transfer_params"].(map[string]any)
	switch fault := e.fault.Load().(string); fault {
	case faultHang:
		<-r.Context().Done()
		e.gone(rid)
		return
	case fault500:
		writeJSON(w, http.StatusInternalServerError, newErrorBody(500, "standin engine exploded", ""))
		return
	case fault400:
		writeJSON(w, http.StatusBadRequest, newErrorBody(400, "standin says the request is bad", ""))
		return
	case faultBadJSON:
		_, _ = w.Write([]byte("<html>not json</html>"))
		return
	}
	if e.role == RolePrefill {
		e.prefill(w, r, rid, body, kv)
		return
	}
	e.decode(w, r, rid, body, kv)
}

func (e *engine) prefill(w http.ResponseWriter, r *http.Request, rid string, body, kv map[string]any) {
	switch {
	case body["max_tokens"] != float64(1):
		e.refuse(w, "prefill max_tokens = %v, want 1", body["max_tokens"])
		return
	case body["stream"] != false:
		e.refuse(w, "prefill stream = %v, want false", body["stream"])
		return
	case body["stream_options"] != nil || body["min_tokens"] != nil:
		e.refuse(w, "prefill carries stream_options or min_tokens: %v", body)
		return
	case kv == nil || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false:
		e.refuse(w, "prefill kv_transfer_params = %v, want do_remote_decode true", kv)
		return
	}
	if v, ok := body["max_completion_tokens"]; ok && v != float64(1) {
		e.refuse(w, "prefill max_completion_tokens = %v, want 1", v)
		return
	}
	transfer, _ := kv["transfer_id"].(string)
	if transfer == "" {
		e.refuse(w, "prefill kv_transfer_params without transfer_id: %v", kv)
		return
	}
	rec := prefillRecord{engine: e, transfer: transfer}
	ans := map[string]any{"id": "cmpl-" + rid, "object": "text_completion", "model": body["model"],
		"choices": []any{map[string]any{"index": 0, "text": "x", "finish_reason": "length"}}}
	if !e.mooncake {
		// What a NIXL-style connector returns: where the decode side reads
		// the blocks from. Unique per request, so forwarding is checked.
		rec.issued, _ = json.Marshal(map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
			"remote_engine_id": "engine-" + e.id, "remote_block_ids": []int{1, 2, len(rid)},
			"remote_host": "127.0.0.1", "remote_port": 5600, "remote_request_id": rid, "tp_size": 1})
		ans["kv_transfer_params"] = json.RawMessage(rec.issued)
	} else {
		ans["kv_transfer_params"] = nil
	}
	e.ledger.put(rid, rec)
	writeJSON(w, http.StatusOK, ans)
}

func (e *engine) decode(w http.ResponseWriter, r *http.Request, rid string, body, kv map[string]any) {
	rec, ok := e.ledger.get(rid)
	if !ok {
		e.refuse(w, "decode request %s before any prefill", rid)
		return
	}
	got, _ := json.Marshal(kv)
	if rec.issued != nil {
		if !jsonEqual(got, rec.issued) {
			e.refuse(w, "decode kv_transfer_params = %s, want the prefill's %s", got, rec.issued)
			return
		}
	} else {
		want := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "transfer_id": rec.transfer}
		if rec.engine.engineID != "" {
			want["remote_engine_id"] = rec.engine.engineID
		}
		if rec.engine.boot != "" {
			want["remote_bootstrap_addr"] = rec.engine.boot
		}
		if !reflect.DeepEqual(kv, want) {
			e.refuse(w, "decode kv_transfer_params = %v, want %v", kv, want)
			return
		}
	}
	n := 3
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if v, ok := body[k].(float64); ok {
			n = int(v)
		}
	}
	chat := r.URL.Path == "/v1/chat/completions"
	if body["stream"] != true {
		text := ""
		for i := range n {
			text += fmt.Sprintf("t%d", i)
		}
		choice := map[string]any{"index": 0, "text": text, "finish_reason": "length"}
		if chat {
			choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "length"}
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": "cmpl-" + rid, "choices": []any{choice}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	fault := e.fault.Load().(string)
	for i := range n {
		if fault == faultCut && i == 2 || fault == faultStall && i == 1 {
			break
		}
		choice := map[string]any{"index": 0, "text": fmt.Sprintf("t%d", i)}
		if chat {
			choice = map[string]any{"index": 0, "delta": map[string]any{"content": fmt.Sprintf("t%d", i)}}
		}
		ev, _ := json.Marshal(map[string]any{"id": "cmpl-" + rid, "choices": []any{choice}})
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			e.gone(rid)
			return
		}
		_ = rc.Flush()
	}
	switch fault {
	case faultCut:
		conn, _, err := rc.Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case faultStall:
		<-r.Context().Done()
		e.gone(rid)
		return
	case faultNoDone:
		return
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		e.gone(rid)
	}
}

// gone notes that the caller of request rid went away before the answer.
func (e *engine) gone(rid string) {
	select {
	case e.canceled <- rid:
	default:
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// rrScheduler is a round-robin stand-in for the conductor's scheduler that
// checks the router's load accounting: every scheduled request must get
// one PrefillDone, then one DecodeDone.
type rrScheduler struct {
	mu        sync.Mutex
	roles     map[string]conductor.Role
	order     []string
	next      map[conductor.Role]int
	open      map[string]*ticketState
	violation []string
	changed   chan struct{} // closed and replaced on every Done
	reject    func(conductor.Request) bool
	scheduled []conductor.Request
	longest   map[string]int
	asked     [][]uint64
}

type ticketState struct{ prefilled bool }

func newRR() *rrScheduler {
	return &rrScheduler{roles: map[string]conductor.Role{}, next: map[conductor.Role]int{},
		open: map[string]*ticketState{}, changed: make(chan struct{})}
}

var _ Scheduler = (*rrScheduler)(nil)

func (s *rrScheduler) Add(in conductor.Instance) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.roles[in.ID]; ok {
		return errors.New("rr: duplicate")
	}
	s.roles[in.ID] = in.Role
	s.order = append(s.order, in.ID)
	return nil
}

func (s *rrScheduler) Remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.roles[id]; !ok {
		return errors.New("rr: unknown")
	}
	delete(s.roles, id)
	s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == id })
	return nil
}

func (s *rrScheduler) pick(role conductor.Role) string {
	var ids []string
	for _, id := range s.order {
		if s.roles[id] == role {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	s.next[role]++
	return ids[s.next[role]%len(ids)]
}

func (s *rrScheduler) Schedule(_ time.Duration, r conductor.Request) (conductor.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reject != nil && s.reject(r) {
		return conductor.Decision{}, fmt.Errorf("%w: predicted TTFT over the SLO", conductor.ErrRejected)
	}
	p, d := s.pick(conductor.Prefill), s.pick(conductor.Decode)
	if p == "" || d == "" {
		return conductor.Decision{}, errors.New("rr: no prefill or no decode instance")
	}
	if _, dup := s.open[r.ID]; dup {
		s.violation = append(s.violation, "Schedule twice: "+r.ID)
	}
	s.open[r.ID] = &ticketState{}
	s.scheduled = append(s.scheduled, r)
	return conductor.Decision{Prefill: p, Decode: d}, nil
}

func (s *rrScheduler) done(id string, decode bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.open[id]
	switch {
	case !ok:
		s.violation = append(s.violation, fmt.Sprintf("Done (decode=%v) of unknown or finished %s", decode, id))
	case !decode && st.prefilled:
		s.violation = append(s.violation, "PrefillDone twice: "+id)
	case decode && !st.prefilled:
		s.violation = append(s.violation, "DecodeDone before PrefillDone: "+id)
	case decode:
		delete(s.open, id)
	default:
		st.prefilled = true
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *rrScheduler) PrefillDone(_ time.Duration, id string) { s.done(id, false) }
func (s *rrScheduler) DecodeDone(_ time.Duration, id string)  { s.done(id, true) }

func (s *rrScheduler) Longest(blocks []uint64) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, blocks)
	return s.longest
}

// waitIdle waits until every scheduled request was released (the router
// releases after the last byte of the answer, so a test that read the
// answer may be a moment early) and checks the accounting.
func (s *rrScheduler) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		n, ch := len(s.open), s.changed
		v := slices.Clone(s.violation)
		s.mu.Unlock()
		require.Empty(t, v, "load accounting")
		if n == 0 {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d requests still hold load after 10s", n)
		}
	}
}

func (s *rrScheduler) setReject(f func(conductor.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reject = f
}

func (s *rrScheduler) queries() [][]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

func (s *rrScheduler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.scheduled)
}

// harness is a router on a real socket in front of stand-in engines.
type harness struct {
	t      *testing.T
	sched  Scheduler
	rr     *rrScheduler // sched, when it is the round-robin one
	router *Router
	srv    *httptest.Server
	client *http.Client
}

// newHarness starts a router over sched (nil: round robin) with the
// instances of engines; cfg may adjust the config.
func newHarness(t *testing.T, sched Scheduler, cfg func(*Config), engines ...*engine) *harness {
	t.Helper()
	h := &harness{t: t, sched: sched}
	if sched == nil {
		h.rr = newRR()
		h.sched = h.rr
	}
	c := Config{Scheduler: h.sched}
	for _, e := range engines {
		c.Instances = append(c.Instances, e.instance())
	}
	if cfg != nil {
		cfg(&c)
	}
	r, err := New(c)
	require.NoError(t, err)
	h.router = r
	h.srv = httptest.NewServer(r)
	tr := &http.Transport{}
	h.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		h.srv.Close()
		r.Close()
		tr.CloseIdleConnections()
	})
	return h
}

// cluster makes a ledger and stand-ins: prefill p0..p{np-1}, decode
// d0..d{nd-1}.
func cluster(t *testing.T, np, nd int) (*ledger, []*engine) {
	l := &ledger{prefill: map[string]prefillRecord{}}
	var es []*engine
	for i := range np {
		es = append(es, newEngine(t, l, fmt.Sprintf("p%d", i), RolePrefill))
	}
	for i := range nd {
		es = append(es, newEngine(t, l, fmt.Sprintf("d%d", i), RoleDecode))
	}
	return l, es
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(method, path string, body any) answer {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(h.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// apiErr decodes an OpenAI error body and checks its code is the status.
func (a answer) apiErr(t *testing.T) errorDetail {
	t.Helper()
	var b errorBody
	require.NoError(t, json.Unmarshal(a.body, &b), "error body %s", a.body)
	require.Equal(t, a.status, b.Error.Code, "code in %s", a.body)
	require.NotEmpty(t, b.Error.Message)
	return b.Error
}

// events splits a server-sent-event stream into its data payloads.
func events(body []byte) []string {
	var out []string
	for ev := range strings.SplitSeq(string(body), "\n\n") {
		if d, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// metric reads one series from /metrics, as Prometheus would scrape it:
// series is the exact name and labels ("name{a=\"x\"}"); 0 when absent.
func (h *harness) metric(series string) float64 {
	h.t.Helper()
	a := h.do(http.MethodGet, "/metrics", nil)
	require.Equal(h.t, http.StatusOK, a.status)
	for line := range strings.SplitSeq(string(a.body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(h.t, err, line)
			return f
		}
	}
	return 0
}

// deadPort is a loopback address nothing listens on: dialing it is refused.
func deadPort(t *testing.T) string {
	return "http://" + nettest.RefusedAddr(t)
}

package router

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/indexer"
	"github.com/mooncake-go/mooncake/internal/secure"
)

// Scheduler is what the router needs of the conductor's scheduling core;
// *conductor.Scheduler is the real one. Times are offsets from the router's
// start. The router never calls it from two goroutines at once.
type Scheduler interface {
	// Add and Remove keep the scheduler's instances in step with the
	// router's registry.
	Add(in conductor.Instance) error
	Remove(id string) error
	// Schedule picks the prefill and decode instance of r and counts its
	// load on them; an error wrapping conductor.ErrRejected is an admission
	// rejection (429).
	Schedule(now time.Duration, r conductor.Request) (conductor.Decision, error)
	// PrefillDone and DecodeDone release the load Schedule counted. The
	// router calls each exactly once per scheduled request, whatever
	// happened to it.
	PrefillDone(now time.Duration, id string)
	DecodeDone(now time.Duration, id string)
	// Longest is the prefix of blocks each holder has, in blocks.
	Longest(blocks []uint64) map[string]int
}

// Router is the conductor's HTTP front: an http.Handler serving the OpenAI
// routes, the registration and index APIs, /metrics and /health.
type Router struct {
	cfg     Config
	client  *http.Client
	ownedTr *http.Transport // Close closes its idle connections
	metrics *metrics
	mux     *http.ServeMux
	handler http.Handler // mux behind the token check, if any
	epoch   time.Time

	// schedMu serialises the calls to the scheduler. Never held while
	// taking mu.
	schedMu sync.Mutex
	sched   Scheduler

	mu        sync.RWMutex
	instances map[string]Instance

	// scheme names a prompt's blocks in the prefix index.
	scheme blockhash.Scheme

	// tokenizeNext rotates /tokenize over the instances.
	tokenizeNext atomic.Uint64
	// inflight counts the inference requests being served, for /health.
	inflight atomic.Int64
	// probes holds which instances answered their last probe, for /health.
	probes prober
}

// New builds a router and registers cfg.Instances with its scheduler.
func New(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Router{cfg: cfg, sched: cfg.Scheduler, instances: map[string]Instance{}, epoch: time.Now()}
	r.scheme, _ = cfg.scheme() // checked by Validate
	r.client = cfg.Client
	if r.client == nil {
		r.ownedTr = http.DefaultTransport.(*http.Transport).Clone()
		// Every request holds one connection to its prefill and one to its
		// decode instance; the default of 2 idle per host would make most
		// requests dial.
		r.ownedTr.MaxIdleConnsPerHost = 256
		r.client = &http.Client{Transport: r.ownedTr}
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	r.metrics = newMetrics(reg, r.replicaHistogram())
	for _, in := range cfg.Instances {
		if err := r.Register(in); err != nil {
			// Leave the scheduler as it was found.
			for _, done := range r.Instances() {
				_ = r.Remove(done.ID)
			}
			r.Close()
			return nil, err
		}
	}
	r.mux = http.NewServeMux()
	r.routes(reg)
	r.handler = secure.RequireHTTP(cfg.Token, r.open, r.mux)
	return r, nil
}

// open tells the routes that answer without the Token: probes, and the
// OpenAI API unless TokenOnInference. Every other route requires it, those
// added later included.
func (r *Router) open(req *http.Request) bool {
	switch req.URL.Path {
	case "/health", "/metrics":
		return true
	case "/v1/completions", "/v1/chat/completions", "/v1/models":
		return !r.cfg.TokenOnInference
	}
	return false
}

func (r *Router) routes(reg *prometheus.Registry) {
	r.mux.Handle("/v1/completions", only(http.MethodPost, r.inference(routeCompletions)))
	r.mux.Handle("/v1/chat/completions", only(http.MethodPost, r.inference(routeChat)))
	r.mux.Handle("/v1/models", only(http.MethodGet, http.HandlerFunc(r.handleModels)))
	r.mux.HandleFunc("/v1/instances", r.handleInstances)
	r.mux.HandleFunc("/v1/instances/{id}", r.handleInstance)
	r.mux.Handle("/v1/index/query", only(http.MethodPost, http.HandlerFunc(r.handleIndexQuery)))
	r.mux.Handle("/metrics", only(http.MethodGet, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	r.mux.Handle("/health", only(http.MethodGet, http.HandlerFunc(r.handleHealth)))
	if r.cfg.Indexer != nil {
		r.cfg.Indexer.Routes(r.mux)
	}
	r.mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, errorf(http.StatusNotFound, "no route %s %s", req.Method, req.URL.Path))
	})
}

// only answers other methods than method with a JSON 405 (the mux's own
// 405 is plain text).
func only(method string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, errorf(http.StatusMethodNotAllowed, "%s %s: use %s", req.Method, req.URL.Path, method))
			return
		}
		h.ServeHTTP(w, req)
	})
}

// ServeHTTP serves the router's routes.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.handler.ServeHTTP(w, req) }

// Close releases the router's idle connections to engines. Requests in
// progress are the HTTP server's to drain (http.Server.Shutdown) first.
func (r *Router) Close() {
	if r.ownedTr != nil {
		r.ownedTr.CloseIdleConnections()
	}
}

// now is the scheduler's clock: time since the router started.
func (r *Router) now() time.Duration { return time.Since(r.epoch) }

// Register adds an instance to the router and the scheduler.
func (r *Router) Register(in Instance) error {
	in.URL = strings.TrimRight(in.URL, "/")
	in.Bootstrap = strings.TrimRight(in.Bootstrap, "/")
	if err := in.Validate(); err != nil {
		return err
	}
	role, _ := in.role()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[in.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateInstance, in.ID)
	}
	var events *indexer.Registration
	if in.KVEvents != "" {
		if r.cfg.Indexer == nil {
			return fmt.Errorf("%w: %s: kv_events, but the router follows no KV events (no Indexer)", ErrInvalidInstance, in.ID)
		}
		hp := r.cfg.hashProfile()
		if hp == nil {
			return fmt.Errorf("%w: %s: kv_events needs the engines' block hashing (BlockHash, e.g. vllm:sha256), not %s", ErrInvalidInstance, in.ID, r.scheme)
		}
		events = &indexer.Registration{Endpoint: in.KVEvents, Replay: in.KVReplay, Type: indexer.TypeVLLM,
			Model: r.cfg.Model, Instance: in.ID, BlockSize: r.scheme.BlockSize(), Hash: hp}
		if role == conductor.Prefill && in.CacheBlocks == 0 {
			in.CacheBlocks = DefaultEventCacheBlocks
		}
	}
	r.schedMu.Lock()
	err := r.sched.Add(conductor.Instance{ID: in.ID, Role: role, CacheBlocks: in.CacheBlocks, Events: events != nil})
	r.schedMu.Unlock()
	switch {
	case errors.Is(err, conductor.ErrDuplicate):
		return fmt.Errorf("%w: %s: %v", ErrDuplicateInstance, in.ID, err)
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrInvalidInstance, in.ID, err)
	}
	if events != nil {
		if err := r.cfg.Indexer.Register(*events); err != nil {
			r.schedMu.Lock()
			_ = r.sched.Remove(in.ID)
			r.schedMu.Unlock()
			return fmt.Errorf("%w: %s: kv_events: %v", ErrInvalidInstance, in.ID, err)
		}
	}
	r.instances[in.ID] = in
	r.metrics.instances.WithLabelValues(in.Role).Inc()
	return nil
}

// Remove unregisters an instance. Requests already sent to it finish
// there; new ones are not scheduled onto it.
func (r *Router) Remove(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownInstance, id)
	}
	r.schedMu.Lock()
	err := r.sched.Remove(id)
	r.schedMu.Unlock()
	if err != nil {
		return fmt.Errorf("router: remove %s from the scheduler: %w", id, err)
	}
	delete(r.instances, id)
	r.metrics.instances.WithLabelValues(in.Role).Dec()
	if in.KVEvents != "" {
		// Its blocks leave the scheduler's index with it; the indexer's go
		// when it unsubscribes.
		if _, err := r.cfg.Indexer.Unregister(in.ID, "", 0); err != nil && !errors.Is(err, indexer.ErrNotFound) {
			return fmt.Errorf("router: stop following %s's KV events: %w", id, err)
		}
	}
	return nil
}

// Instances lists the registered instances by ID.
func (r *Router) Instances() []Instance {
	r.mu.RLock()
	out := make([]Instance, 0, len(r.instances))
	for _, in := range r.instances {
		out = append(out, in)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (r *Router) instance(id string) (Instance, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	in, ok := r.instances[id]
	return in, ok
}

// Longest is the longest prefix, in blocks, each holder of the prefix index
// has of blocks.
func (r *Router) Longest(blocks []uint64) map[string]int {
	r.schedMu.Lock()
	defer r.schedMu.Unlock()
	return r.sched.Longest(blocks)
}

// statusOf maps a registration error to its HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrUnknownInstance):
		return http.StatusNotFound
	case errors.Is(err, ErrDuplicateInstance):
		return http.StatusConflict
	case errors.Is(err, ErrInvalidInstance):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

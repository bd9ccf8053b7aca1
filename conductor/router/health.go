package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// maxProbes bounds the probes in flight at once, so that a /health over
// many instances costs a few probe timeouts, not one per instance, and
// opens no more connections than that.
const maxProbes = 16

// health is the body of GET /health. Ready says whether a request can be
// routed now: at least one reachable prefill and one reachable decode
// instance. Prefill and Decode count the registered instances, the
// Reachable ones those whose engine answered its last probe.
type health struct {
	Status           string        `json:"status"` // "ok" when ready, else "unavailable"
	Ready            bool          `json:"ready"`
	Prefill          int           `json:"prefill"`
	Decode           int           `json:"decode"`
	ReachablePrefill int           `json:"reachable_prefill"`
	ReachableDecode  int           `json:"reachable_decode"`
	Unreachable      []unreachable `json:"unreachable"`
	Inflight         int64         `json:"inflight"`
}

// unreachable is an instance whose last probe failed, and why.
type unreachable struct {
	ID    string `json:"id"`
	Role  string `json:"role"`
	URL   string `json:"url"`
	Error string `json:"error"`
}

// handleHealth answers 200 when the router can route and 503 when it
// cannot, with the same body: a readiness probe (Kubernetes, a load
// balancer) takes the status, an operator reads which instances are down.
func (r *Router) handleHealth(w http.ResponseWriter, _ *http.Request) {
	list := r.Instances()
	errs := r.probes.check(list, r.cfg.ProbeInterval, r.probe)
	h := health{Inflight: r.inflight.Load(), Unreachable: []unreachable{}}
	for _, in := range list {
		err := errs[in.ID]
		if err != nil {
			h.Unreachable = append(h.Unreachable, unreachable{ID: in.ID, Role: in.Role, URL: in.URL, Error: err.Error()})
		}
		if in.Role == RolePrefill {
			h.Prefill++
			h.ReachablePrefill += btoi(err == nil)
		} else {
			h.Decode++
			h.ReachableDecode += btoi(err == nil)
		}
	}
	h.Ready = h.ReachablePrefill > 0 && h.ReachableDecode > 0
	status := http.StatusOK
	if h.Status = "ok"; !h.Ready {
		h.Status, status = "unavailable", http.StatusServiceUnavailable
	}
	writeJSON(w, status, h)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// probe asks an instance's engine GET /health (vLLM and SGLang serve it)
// within Config.ProbeTimeout. Any answer below 500 counts as reachable:
// an engine without the route (404) or behind a key (401) still serves;
// a 5xx is an engine that says it cannot (vLLM answers 503 once its
// engine loop died).
func (r *Router) probe(in Instance) error {
	// Not the caller's context: the answer is cached for the next callers,
	// and must not record that one of them went away.
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	// Drained (a little) so that the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		return fmt.Errorf("GET %s/health: %s", in.URL, resp.Status)
	}
	return nil
}

// prober caches the outcome of each instance's last probe, so that /health
// stays cheap however often it is polled.
type prober struct {
	// mu is held over a round of probes: concurrent /health calls wait for
	// the round in progress and share its answers instead of probing again.
	mu   sync.Mutex
	last map[string]probeResult // by instance ID
}

type probeResult struct {
	url string // the URL probed: a re-registered instance is probed again
	at  time.Time
	err error // nil: reachable
}

// check returns the outcome per instance ID of list (nil: reachable),
// probing those whose last outcome is older than ttl, or that have none,
// at most maxProbes at a time. Instances no longer registered are
// forgotten.
func (p *prober) check(list []Instance, ttl time.Duration, probe func(Instance) error) map[string]error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	next := make(map[string]probeResult, len(list))
	var stale []Instance
	for _, in := range list {
		if last, ok := p.last[in.ID]; ok && last.url == in.URL && now.Sub(last.at) < ttl {
			next[in.ID] = last
			continue
		}
		stale = append(stale, in)
	}
	results := make([]probeResult, len(stale))
	sem := make(chan struct{}, maxProbes)
	var wg sync.WaitGroup
	for i, in := range stale {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := probe(in)
			results[i] = probeResult{url: in.URL, at: time.Now(), err: err}
		})
	}
	wg.Wait()
	for i, in := range stale {
		next[in.ID] = results[i]
	}
	p.last = next
	out := make(map[string]error, len(next))
	for id, res := range next {
		out[id] = res.err
	}
	return out
}

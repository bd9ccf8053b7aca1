package router

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series. Labels come from small fixed
// sets (routes, outcomes, phases) and the registered instance IDs.
type metrics struct {
	requests  *prometheus.CounterVec   // route, outcome
	rejected  prometheus.Counter       // admission control said no (429)
	ttft      *prometheus.HistogramVec // route; streamed requests only
	e2e       *prometheus.HistogramVec // route; every answered request
	prefill   *prometheus.HistogramVec // instance; successful prefill calls
	engineErr *prometheus.CounterVec   // instance, phase
	inflight  prometheus.Gauge
	instances *prometheus.GaugeVec // role
	reused    prometheus.Counter
}

// newMetrics registers the router's series with reg; replicas, when not
// nil, is the scheduler's replica histogram behind
// mooncake_conductor_block_replicas (Router.replicaHistogram).
func newMetrics(reg prometheus.Registerer, replicas func(dst []int) []int) *metrics {
	// Latencies of LLM serving span milliseconds (a cached prefill) to
	// minutes (a long generation).
	buckets := prometheus.ExponentialBuckets(0.005, 2, 17)
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mooncake_conductor_requests_total",
			Help: "Requests the router answered, by route and outcome (ok, bad_request, rejected, engine_error, timeout, unavailable, canceled).",
		}, []string{"route", "outcome"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mooncake_conductor_rejected_total",
			Help: "Requests admission control rejected (answered 429).",
		}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mooncake_conductor_ttft_seconds",
			Help:    "Time from a streamed request's arrival to the first event of the decode stream sent to the client.",
			Buckets: buckets,
		}, []string{"route"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mooncake_conductor_e2e_seconds",
			Help:    "Time from a request's arrival to the end of its answer, whatever the outcome.",
			Buckets: buckets,
		}, []string{"route"}),
		prefill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mooncake_conductor_prefill_seconds",
			Help:    "Duration of successful prefill calls (max_tokens=1), by prefill instance.",
			Buckets: buckets,
		}, []string{"instance"}),
		engineErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mooncake_conductor_engine_errors_total",
			Help: "Engine calls that failed (transport error, timeout, 5xx, broken stream), by instance and phase (tokenize, prefill, decode).",
		}, []string{"instance", "phase"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mooncake_conductor_inflight_requests",
			Help: "Inference requests being routed now.",
		}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mooncake_conductor_instances",
			Help: "Registered instances, by role.",
		}, []string{"role"}),
		reused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mooncake_conductor_reused_blocks_total",
			Help: "Prefix blocks the scheduler expected the chosen prefill instances to reuse.",
		}),
	}
	reg.MustRegister(m.requests, m.rejected, m.ttft, m.e2e, m.prefill, m.engineErr, m.inflight, m.instances, m.reused)
	if replicas != nil {
		reg.MustRegister(&replicaCollector{hist: replicas, desc: prometheus.NewDesc(
			"mooncake_conductor_block_replicas",
			"Blocks of the prefix index by the number of prefill instances whose cache holds them (1, 2, 3, 4+; the store does not count), as of the scrape.",
			[]string{"replicas"}, nil)})
	}
	return m
}

// replicaBuckets are the values of the replicas label: blocks held by 1,
// 2, 3, and 4 or more prefill instances.
var replicaBuckets = []string{"1", "2", "3", "4+"}

// replicaCollector is the gauge vector mooncake_conductor_block_replicas,
// computed from the scheduler's prefix index when scraped: cache load
// balancing gives hot blocks replicas, and this is how many they have.
type replicaCollector struct {
	desc *prometheus.Desc
	hist func(dst []int) []int

	mu      sync.Mutex // scrapes may overlap
	scratch []int
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	c.scratch = c.hist(c.scratch)
	var v [4]float64
	for n, blocks := range c.scratch {
		if n > 0 {
			v[min(n, len(v))-1] += float64(blocks)
		}
	}
	c.mu.Unlock()
	for i, label := range replicaBuckets {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v[i], label)
	}
}

// replicaHistogrammer is what a Scheduler offers for the replica gauge;
// *conductor.Scheduler has it (conductor.Scheduler.ReplicaHistogram).
type replicaHistogrammer interface {
	ReplicaHistogram(dst []int) []int
}

// replicaHistogram is the scheduler's replica histogram, called under
// schedMu like every call to the scheduler; nil when the scheduler has
// none (and the router exports no replica gauge).
func (r *Router) replicaHistogram() func(dst []int) []int {
	rh, ok := r.sched.(replicaHistogrammer)
	if !ok {
		return nil
	}
	return func(dst []int) []int {
		r.schedMu.Lock()
		defer r.schedMu.Unlock()
		return rh.ReplicaHistogram(dst)
	}
}

package router

import (
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

func newMetrics(reg prometheus.Registerer) *metrics {
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
	return m
}

package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// metrics are the engine's Prometheus series. Label values are resolved on
// the data path only through small fixed sets.
type metrics struct {
	bytes    *prometheus.CounterVec   // op, transport
	requests *prometheus.CounterVec   // op, transport, status
	latency  *prometheus.HistogramVec // op, transport
	served   func(op transport.Op, n uint64, err error)
	notifies prometheus.Counter
	// refreshes counts the descriptor requests that refreshed a
	// same-host view after a miss.
	refreshes prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mooncake_te_transferred_bytes_total",
			Help: "Bytes moved by completed requests this engine initiated.",
		}, []string{"op", "transport"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mooncake_te_requests_total",
			Help: "Requests this engine initiated, by final status.",
		}, []string{"op", "transport", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mooncake_te_request_duration_seconds",
			Help:    "Time from submission to final status of initiated requests.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 20),
		}, []string{"op", "transport"}),
		notifies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mooncake_te_notifications_received_total",
			Help: "Notifications received on the handshake socket.",
		}),
		refreshes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mooncake_te_segment_refreshes_total",
			Help: "Descriptor requests that refreshed a peer's same-host view after a miss.",
		}),
	}
	servedBytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mooncake_te_served_bytes_total",
		Help: "Bytes this engine served to peers over TCP.",
	}, []string{"op"})
	servedFail := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mooncake_te_served_failures_total",
		Help: "Peer requests this engine rejected or could not finish.",
	}, []string{"op"})
	m.served = func(op transport.Op, n uint64, err error) {
		if err != nil {
			servedFail.WithLabelValues(op.String()).Inc()
			return
		}
		servedBytes.WithLabelValues(op.String()).Add(float64(n))
	}
	if reg != nil {
		reg.MustRegister(m.bytes, m.requests, m.latency, m.notifies, m.refreshes, servedBytes, servedFail)
	}
	return m
}

func (m *metrics) finished(op Op, via string, n uint64, st Status, d time.Duration) {
	m.requests.WithLabelValues(op.String(), via, st.String()).Inc()
	if st == Completed {
		m.bytes.WithLabelValues(op.String(), via).Add(float64(n))
		m.latency.WithLabelValues(op.String(), via).Observe(d.Seconds())
	}
}

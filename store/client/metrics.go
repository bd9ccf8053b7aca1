package client

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// metrics are the client's, named as Mooncake's client metrics where it
// has the same one (mooncake_transfer_{read,write}_bytes,
// mooncake_transfer_{get,put,batch_get,batch_put}_latency).
type metrics struct {
	readBytes, writeBytes prometheus.Counter
	latency               *prometheus.HistogramVec // by op: get, put, batch_get, batch_put
	failures              *prometheus.CounterVec   // by op and Mooncake error name
	moveFailures          *prometheus.CounterVec   // tier moves, by target medium
	ssdFailed             prometheus.Gauge         // 1 once the SSD tier failed (ssd.go)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		readBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "mooncake_transfer_read_bytes",
			Help: "Value bytes read by gets."}),
		writeBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "mooncake_transfer_write_bytes",
			Help: "Value bytes written by puts, once per replica."}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mooncake_transfer_latency_seconds",
			Help:    "Latency of store calls (op: get, put, batch_get, batch_put).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18)}, []string{"op"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mooncake_transfer_failures_total",
			Help: "Failed objects by op and error code."}, []string{"op", "code"}),
		moveFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mooncake_store_move_failures_total",
			Help: "Tier moves (offload, spill, promotion) that failed, by target medium (disk, dram)."}, []string{"target"}),
		ssdFailed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mooncake_store_ssd_tier_failed",
			Help: "1 once the SSD tier had an I/O error and was unmounted."}),
	}
	if reg != nil {
		reg.MustRegister(m.readBytes, m.writeBytes, m.latency, m.failures, m.moveFailures, m.ssdFailed)
	}
	return m
}

// observe records one call of op over n objects, taking each object's
// error from errOf.
func (m *metrics) observe(op string, n int, start time.Time, errOf func(i int) error) {
	if n > 1 {
		op = "batch_" + op
	}
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	for i := range n {
		if err := errOf(i); err != nil {
			m.failures.WithLabelValues(op, codeName(err)).Inc()
		}
	}
}

// codeName is the Mooncake name of err's code, or "OTHER".
func codeName(err error) string {
	var e *storepb.Error
	if errors.As(err, &e) {
		return e.Code.String()
	}
	return "OTHER"
}

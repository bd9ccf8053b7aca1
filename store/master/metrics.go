package master

import (
	"context"
	"path"
	"strings"
	"sync"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// metrics are the master's Prometheus metrics, named as Mooncake's master
// names them where it has the same metric (master_key_count,
// master_<rpc>_requests_total, ...), so dashboards built for it work.
type metrics struct {
	srv *Server
	reg *prometheus.Registry

	mu   sync.Mutex
	rpcs map[string]*rpcCounters
}

type rpcCounters struct {
	requests, failures          prometheus.Counter
	partial, items, failedItems prometheus.Counter // batch RPCs only
	batch                       bool
}

func newMetrics(s *Server) *metrics {
	m := &metrics{srv: s, reg: prometheus.NewRegistry(), rpcs: make(map[string]*rpcCounters)}
	m.reg.MustRegister(m)
	return m
}

var gauges = []struct {
	name, help string
	get        func(Stats) float64
}{
	{"master_allocated_bytes", "Bytes allocated in mounted segments, puts in flight included.", func(s Stats) float64 { return float64(s.Used) }},
	{"master_total_capacity_bytes", "Bytes of all mounted segments.", func(s Stats) float64 { return float64(s.Capacity) }},
	{"master_key_count", "Readable objects.", func(s Stats) float64 { return float64(s.Keys) }},
	{"master_soft_pin_key_count", "Readable objects with a running soft pin.", func(s Stats) float64 { return float64(s.SoftPinned) }},
	{"master_active_clients", "Clients the master knows.", func(s Stats) float64 { return float64(s.Clients) }},
	{"master_value_size_bytes", "Bytes of readable values, one replica each.", func(s Stats) float64 { return float64(s.ValueBytes) }},
	{"master_mounted_segments", "Mounted segments.", func(s Stats) float64 { return float64(s.Segments) }},
}

var counters = []struct {
	name, help string
	get        func(Stats) float64
}{
	{"master_evicted_key_count", "Objects evicted.", func(s Stats) float64 { return float64(s.EvictedKeys) }},
	{"master_evicted_size_bytes", "Bytes freed by eviction.", func(s Stats) float64 { return float64(s.EvictedBytes) }},
	{"master_put_start_discard_cnt", "Zombie puts pre-empted by a new PutStart.", func(s Stats) float64 { return float64(s.Discarded) }},
	{"master_put_start_release_cnt", "Zombie puts whose space was reclaimed.", func(s Stats) float64 { return float64(s.Released) }},
	{"master_put_start_alloc_failures_total", "PutStarts that found no space.", func(s Stats) float64 { return float64(s.AllocFailures) }},
}

var leaderDesc = prometheus.NewDesc("master_is_leader", "1 while this master serves (leads), 0 on standby.", nil, nil)

// The KV events counters (kvevents.go), present with KV events only.
var (
	kvPublishedDesc = prometheus.NewDesc("mooncake_master_kv_events_published_total",
		"KV events sent on the ZMQ PUB socket.", nil, nil)
	kvDroppedDesc = prometheus.NewDesc("mooncake_master_kv_events_dropped_total",
		"KV events dropped because the publisher's queue was full.", nil, nil)
)

// Describe sends nothing: the metric set is unchecked (per-RPC counters
// appear as RPCs are first seen).
func (m *metrics) Describe(chan<- *prometheus.Desc) {}

// Collect reads the current term's Service at scrape time.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	leading := 0.0
	if m.srv.Leading() {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leading)
	if kv := m.srv.kv; kv != nil {
		ch <- prometheus.MustNewConstMetric(kvPublishedDesc, prometheus.CounterValue, float64(kv.published.Load()))
		ch <- prometheus.MustNewConstMetric(kvDroppedDesc, prometheus.CounterValue, float64(kv.dropped.Load()))
	}
	svc := m.srv.Service()
	if svc != nil {
		st := svc.Stats()
		for _, g := range gauges {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, g.help, nil, nil), prometheus.GaugeValue, g.get(st))
		}
		for _, c := range counters {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, c.help, nil, nil), prometheus.CounterValue, c.get(st))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rpcs {
		r.requests.Collect(ch)
		r.failures.Collect(ch)
		if r.batch {
			r.partial.Collect(ch)
			r.items.Collect(ch)
			r.failedItems.Collect(ch)
		}
	}
}

// snake turns a gRPC method name into Mooncake's metric stem:
// "BatchGetReplicaList" -> "batch_get_replica_list".
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (m *metrics) counters(method string) *rpcCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.rpcs[method]; r != nil {
		return r
	}
	stem := "master_" + snake(method)
	c := func(suffix, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: stem + suffix, Help: help + " (" + method + ")."})
	}
	r := &rpcCounters{requests: c("_requests_total", "Requests"), failures: c("_failures_total", "Requests that failed"),
		batch: strings.HasPrefix(method, "Batch")}
	if r.batch {
		r.partial = c("_partial_successes_total", "Batches with some items failed")
		r.items = c("_items_total", "Items in batches")
		r.failedItems = c("_failed_items_total", "Items that failed")
	}
	m.rpcs[method] = r
	return r
}

// interceptor counts every RPC and its outcome, from the Results in the
// response (store errors travel there, not as gRPC errors).
func (m *metrics) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	r := m.counters(path.Base(info.FullMethod))
	r.requests.Inc()
	items, failed := outcome(resp)
	switch {
	case err != nil || (items > 0 && failed == items):
		r.failures.Inc()
	case failed > 0 && r.batch:
		r.partial.Inc()
	}
	if r.batch {
		r.items.Add(float64(items))
		r.failedItems.Add(float64(failed))
	}
	return resp, err
}

// outcome counts the results in a response and how many are errors; a
// call refused whole (a nil response) has none. Exist answers OBJECT_NOT_FOUND for a missing key, which is no failure.
func outcome(resp any) (items, failed int) {
	bad := func(r *storepb.Result) bool {
		c := storepb.Code(r.GetCode())
		return c != storepb.OK && c != storepb.ObjectNotFound
	}
	one := func(r *storepb.Result) {
		items++
		if bad(r) {
			failed++
		}
	}
	switch v := resp.(type) {
	case *storepb.Result:
		one(v)
	case *storepb.BatchResult:
		for _, r := range v.GetResults() {
			one(r)
		}
	case *storepb.PutStartResponse:
		one(v.GetResult())
	case *storepb.BatchPutStartResponse:
		for _, it := range v.GetItems() {
			one(it.GetResult())
		}
	case *storepb.GetReplicaListResponse:
		one(v.GetResult())
	case *storepb.BatchGetReplicaListResponse:
		for _, it := range v.GetItems() {
			one(it.GetResult())
		}
	case *storepb.RemoveAllResponse:
		one(v.GetResult())
	case *storepb.PingResponse:
		one(v.GetResult())
	}
	return items, failed
}

package master

import (
	"context"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// metrics are the master's Prometheus metrics, named and labelled as
// Mooncake's master names them where it has the same quantity
// (master_key_count, master_<rpc>_requests_total, segment_allocated_bytes
// {segment}, ...), so dashboards built for it work; docs/master-http.md
// maps every official name. Every per-RPC counter is there from the start,
// at 0, as Mooncake's are.
type metrics struct {
	srv *Server
	reg *prometheus.Registry

	mu   sync.Mutex
	rpcs map[string]*rpcCounts // by gRPC method
	sum  summaryState          // the previous /metrics/summary (metrics_summary.go)

	// valueSize is Mooncake's histogram of the sizes of the values put.
	valueSize prometheus.Histogram
	// GetReplicaList lookups: all, those that found the object, and those
	// served from DRAM or from an SSD tier (with their bytes).
	gets, validGets        atomic.Uint64
	memHits, memHitBytes   atomic.Uint64
	fileHits, fileHitBytes atomic.Uint64
	partialAllocs          atomic.Uint64 // PutStarts placing fewer replicas than asked

	// Snapshots written (to etcd under HA, to disk with Persist), those
	// that failed, and how long each took.
	snapshots, snapshotFails atomic.Uint64
	snapshotTime             prometheus.Histogram
}

// rpcCounts are one gRPC method's counters, exported under each stem
// (master_<stem>_requests_total, ...).
type rpcCounts struct {
	stems                       []string
	batch                       bool
	requests, failures          atomic.Uint64
	partial, items, failedItems atomic.Uint64 // batch RPCs only
}

// officialStems names the methods whose metric stem in Mooncake is not
// the snake case of our method name; ours stays exported beside it.
var officialStems = map[string]string{"ReMountSegment": "remount_segment"}

// snapshotBuckets are Mooncake's buckets for master_snapshot_duration_ms.
var snapshotBuckets = []float64{0, 500, 1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000}

// snapshotWritten counts a snapshot that began at start and ended with err.
func (m *metrics) snapshotWritten(start time.Time, err error) {
	if err != nil {
		m.snapshotFails.Add(1)
		return
	}
	m.snapshots.Add(1)
	m.snapshotTime.Observe(float64(time.Since(start).Milliseconds()))
}

// valueSizeBuckets are Mooncake's buckets for master_value_size_bytes.
var valueSizeBuckets = []float64{4096, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}

func newMetrics(s *Server) *metrics {
	m := &metrics{srv: s, reg: prometheus.NewRegistry(), rpcs: make(map[string]*rpcCounts),
		sum: summaryState{at: time.Now()}}
	m.valueSize = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "master_value_size_bytes",
		Help: "Sizes of the values put (each PutStart that placed its value, and each put slot reserved).", Buckets: valueSizeBuckets})
	for _, md := range storepb.Master_ServiceDesc.Methods {
		m.counters(md.MethodName)
	}
	m.snapshotTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "master_snapshot_duration_ms",
		Help: "How long snapshots took to write, in milliseconds.", Buckets: snapshotBuckets})
	m.reg.MustRegister(m, m.valueSize, m.snapshotTime)
	return m
}

type gauge struct {
	name, help string
	get        func(Stats) float64
}

var gauges = []gauge{
	{"master_allocated_bytes", "Bytes allocated in mounted DRAM segments, puts in flight included.", func(s Stats) float64 { return float64(s.Used) }},
	{"master_total_capacity_bytes", "Bytes of all mounted DRAM segments.", func(s Stats) float64 { return float64(s.Capacity) }},
	{"master_allocated_file_size_bytes", "Bytes allocated in the nodes' SSD tiers.", func(s Stats) float64 { return float64(s.DiskUsed) }},
	{"master_total_file_capacity_bytes", "Bytes of all mounted SSD tiers.", func(s Stats) float64 { return float64(s.DiskCapacity) }},
	{"master_key_count", "Readable objects.", func(s Stats) float64 { return float64(s.Keys) }},
	{"master_soft_pin_key_count", "Readable objects with a running soft pin.", func(s Stats) float64 { return float64(s.SoftPinned) }},
	{"master_active_clients", "Clients the master knows.", func(s Stats) float64 { return float64(s.Clients) }},
	{"master_value_bytes", "Bytes of readable values, one replica each.", func(s Stats) float64 { return float64(s.ValueBytes) }},
	{"master_mounted_segments", "Mounted segments.", func(s Stats) float64 { return float64(s.Segments) }},
	{"master_held_segments", "Mounted segments held from new replicas after a remount (--remount_hold_sec).", func(s Stats) float64 { return float64(s.HeldSegments) }},
	{"master_moves_in_flight", "SSD-tier and drain moves handed to clients and not ended, those a new leader restored included.", func(s Stats) float64 { return float64(s.MovesInFlight) }},
}

var counters = []gauge{
	{"master_evicted_key_count", "Objects evicted.", func(s Stats) float64 { return float64(s.EvictedKeys) }},
	{"master_evicted_size_bytes", "Bytes freed by eviction.", func(s Stats) float64 { return float64(s.EvictedBytes) }},
	{"master_put_start_discard_cnt", "Zombie puts pre-empted by a new PutStart.", func(s Stats) float64 { return float64(s.Discarded) }},
	{"master_put_start_release_cnt", "Zombie puts whose space was reclaimed.", func(s Stats) float64 { return float64(s.Released) }},
	{"master_put_start_alloc_failures_total", "PutStarts that found no space.", func(s Stats) float64 { return float64(s.AllocFailures) }},
	{"master_promotion_completed_total", "Objects copied back from an SSD tier to DRAM after a hit.", func(s Stats) float64 { return float64(s.Promoted) }},
}

var (
	leaderDesc = prometheus.NewDesc("master_is_leader", "1 while this master serves (leads), 0 on standby.", nil, nil)
	// Per segment name (a client mounting several segments under one name
	// has them summed), as Mooncake labels them.
	segAllocDesc = prometheus.NewDesc("segment_allocated_bytes", "Bytes allocated in the DRAM segments of this name.",
		[]string{"segment"}, nil)
	segCapDesc = prometheus.NewDesc("segment_total_capacity_bytes", "Bytes of the DRAM segments of this name.",
		[]string{"segment"}, nil)
	memCacheDesc  = prometheus.NewDesc("mem_cache_nums_", "Readable objects with a DRAM replica.", nil, nil)
	fileCacheDesc = prometheus.NewDesc("file_cache_nums_", "Readable objects with an SSD tier replica.", nil, nil)
	lastSeqDesc   = prometheus.NewDesc("ha_oplog_last_sequence_id", "The last record of the leader's journal (0 without one).",
		nil, nil)
	promotingDesc = prometheus.NewDesc("master_promotion_in_flight", "Promotions (SSD tier to DRAM copies) in flight.", nil, nil)
	// HA: the standby acknowledging the leader's journal (replicate.go).
	standbyInSyncDesc = prometheus.NewDesc("master_journal_standby_in_sync",
		"1 while a designated standby's acknowledgements make the leader's journal records durable.", nil, nil)
	etcdBehindDesc = prometheus.NewDesc("master_journal_etcd_behind_records",
		"Journal records durable (a standby has them) and not yet in etcd.", nil, nil)
)

// The KV events counters (kvevents.go), present with KV events only.
var (
	kvPublishedDesc = prometheus.NewDesc("mooncake_master_kv_events_published_total",
		"KV events sent on the ZMQ PUB socket.", nil, nil)
	kvDroppedDesc = prometheus.NewDesc("mooncake_master_kv_events_dropped_total",
		"KV events dropped because the publisher's queue was full.", nil, nil)
)

// Describe sends nothing: the metric set is unchecked (segment gauges
// come and go with the segments).
func (m *metrics) Describe(chan<- *prometheus.Desc) {}

func counter(ch chan<- prometheus.Metric, name, help string, v uint64) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, float64(v))
}

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
	if svc := m.srv.Service(); svc != nil {
		m.collectService(ch, svc)
	}
	counter(ch, "total_get_nums_", "GetReplicaList lookups (a batch counts each key).", m.gets.Load())
	counter(ch, "valid_get_nums_", "Lookups that found a readable object.", m.validGets.Load())
	counter(ch, "mem_cache_hit_nums_", "Lookups served from DRAM.", m.memHits.Load())
	counter(ch, "mem_cache_hit_bytes_total", "Bytes of the values of lookups served from DRAM.", m.memHitBytes.Load())
	counter(ch, "file_cache_hit_nums_", "Lookups served from an SSD tier only.", m.fileHits.Load())
	counter(ch, "file_cache_hit_bytes_total", "Bytes of the values of lookups served from an SSD tier.", m.fileHitBytes.Load())
	counter(ch, "master_put_start_partial_allocations_total", "PutStarts that placed fewer replicas than asked.",
		m.partialAllocs.Load())
	counter(ch, "master_snapshot_success", "Snapshots written.", m.snapshots.Load())
	counter(ch, "master_snapshot_fail", "Snapshots that failed.", m.snapshotFails.Load())
	m.mu.Lock()
	defer m.mu.Unlock()
	for method, r := range m.rpcs {
		for _, stem := range r.stems {
			c := func(suffix, help string, v *atomic.Uint64) {
				counter(ch, stem+suffix, help+" ("+method+").", v.Load())
			}
			c("_requests_total", "Requests", &r.requests)
			c("_failures_total", "Requests that failed", &r.failures)
			if r.batch {
				c("_partial_successes_total", "Batches with some items failed", &r.partial)
				c("_items_total", "Items in batches", &r.items)
				c("_failed_items_total", "Items that failed", &r.failedItems)
			}
		}
	}
}

// collectService sends the gauges and counters read from svc.
func (m *metrics) collectService(ch chan<- prometheus.Metric, svc *Service) {
	st := svc.Stats()
	for _, g := range gauges {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, g.help, nil, nil), prometheus.GaugeValue, g.get(st))
	}
	for _, c := range counters {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, c.help, nil, nil), prometheus.CounterValue, c.get(st))
	}
	ch <- prometheus.MustNewConstMetric(lastSeqDesc, prometheus.GaugeValue, float64(svc.lastSeq()))
	if j, ok := svc.j.(*etcdJournal); ok {
		insync, behind := j.standbyStats()
		ch <- prometheus.MustNewConstMetric(standbyInSyncDesc, prometheus.GaugeValue, insync)
		ch <- prometheus.MustNewConstMetric(etcdBehindDesc, prometheus.GaugeValue, behind)
	}
	counter(ch, "master_attempted_evictions_total", "Evictions run (above the watermark, or after a put found no room).",
		svc.evictAttempts.Load())
	counter(ch, "master_successful_evictions_total", "Evictions that freed bytes.", svc.evictSuccesses.Load())
	for name, v := range map[string]*atomic.Uint64{
		"master_promotion_admitted_total":        &svc.promo.admitted,
		"master_promotion_completed_bytes_total": &svc.promo.bytes,
		"master_promotion_failed_total":          &svc.promo.failed,
		"master_promotion_cancelled_total":       &svc.promo.cancelled,
		"master_promotion_expired_total":         &svc.promo.expired,
	} {
		counter(ch, name, "Promotions (SSD tier to DRAM copies): "+strings.TrimSuffix(strings.TrimPrefix(name,
			"master_promotion_"), "_total")+".", v.Load())
	}
	type usage struct{ used, size uint64 }
	byName := map[string]usage{}
	for _, sg := range svc.dramSegments() {
		u := byName[sg.name]
		byName[sg.name] = usage{u.used + sg.used, u.size + sg.size}
	}
	for name, u := range byName {
		ch <- prometheus.MustNewConstMetric(segAllocDesc, prometheus.GaugeValue, float64(u.used), name)
		ch <- prometheus.MustNewConstMetric(segCapDesc, prometheus.GaugeValue, float64(u.size), name)
	}
	mem, file, promoting := svc.tierCounts()
	ch <- prometheus.MustNewConstMetric(memCacheDesc, prometheus.GaugeValue, float64(mem))
	ch <- prometheus.MustNewConstMetric(fileCacheDesc, prometheus.GaugeValue, float64(file))
	ch <- prometheus.MustNewConstMetric(promotingDesc, prometheus.GaugeValue, float64(promoting))
}

// tierCounts counts the readable objects with a DRAM replica and those
// with an SSD tier replica, and the promotions in flight.
func (s *Service) tierCounts() (mem, file, promoting int) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			var inMem, onDisk bool
			for _, r := range o.replicas {
				inMem, onDisk = inMem || !r.onDisk(), onDisk || r.onDisk()
			}
			mem, file = mem+b2i(inMem), file+b2i(onDisk)
		}
		sh.mu.Unlock()
	}
	s.segMu.Lock()
	for _, t := range s.tasks {
		if t.promotion() {
			promoting++
		}
	}
	s.segMu.Unlock()
	return mem, file, promoting
}

// promotionCounts count the promotions (SSD tier to DRAM copies after a
// read), as Mooncake's master_promotion_* do; completed ones are
// Service.promoted.
type promotionCounts struct {
	admitted  atomic.Uint64 // queued
	bytes     atomic.Uint64 // copied, by completed ones
	failed    atomic.Uint64 // the client reported the copy failed
	cancelled atomic.Uint64 // the object changed or went before the copy ended
	expired   atomic.Uint64 // no report within moveTaskTTL
}

// ended counts a promotion t that ended without joining its object: the
// copy failed (!ok) or the object changed meanwhile.
func (p *promotionCounts) ended(t *moveTask, ok bool) {
	switch {
	case !t.promotion():
	case ok:
		p.cancelled.Add(1)
	default:
		p.failed.Add(1)
	}
}

// promotion reports whether t copies an SSD tier replica back to DRAM (a
// move restored from the journal, without its source, is none).
func (t *moveTask) promotion() bool { return t.src.seg != nil && t.src.onDisk() && !t.dst.onDisk() }

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

func (m *metrics) counters(method string) *rpcCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.rpcs[method]; r != nil {
		return r
	}
	r := &rpcCounts{stems: []string{"master_" + snake(method)}, batch: strings.HasPrefix(method, "Batch")}
	if o, ok := officialStems[method]; ok {
		r.stems = append(r.stems, "master_"+o)
	}
	m.rpcs[method] = r
	return r
}

// interceptor counts every RPC and its outcome, from the Results in the
// response (store errors travel there, not as gRPC errors).
func (m *metrics) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	method := path.Base(info.FullMethod)
	r := m.counters(method)
	r.requests.Add(1)
	items, failed := outcome(resp, strings.HasSuffix(method, "ExistKey"))
	switch {
	case err != nil || (items > 0 && failed == items):
		r.failures.Add(1)
	case failed > 0 && r.batch:
		r.partial.Add(1)
	}
	if r.batch {
		r.items.Add(uint64(items))
		r.failedItems.Add(uint64(failed))
	}
	if err == nil {
		m.observe(req, resp)
	}
	return resp, err
}

// observe feeds the value-size histogram from the puts placed, and the
// lookup counters from the lookups answered.
func (m *metrics) observe(req, resp any) {
	put := func(q *storepb.PutStartRequest, p *storepb.PutStartResponse) {
		if storepb.Code(p.GetResult().GetCode()) != storepb.OK {
			return
		}
		m.valueSize.Observe(float64(q.GetValueLength()))
		if want := max(q.GetConfig().GetReplicaNum(), 1); len(p.GetReplicas()) < int(want) {
			m.partialAllocs.Add(1)
		}
	}
	switch v := resp.(type) {
	case *storepb.PutStartResponse:
		put(req.(*storepb.PutStartRequest), v)
	case *storepb.BatchPutStartResponse:
		items := req.(*storepb.BatchPutStartRequest).GetItems()
		for i, it := range v.GetItems() {
			if i < len(items) {
				put(items[i], it)
			}
		}
	case *storepb.PutReserveResponse:
		// Slots are puts placed ahead of their values.
		n := float64(req.(*storepb.PutReserveRequest).GetValueLength())
		for range max(len(v.GetPacked().GetIndex()), len(v.GetSlots())) {
			m.valueSize.Observe(n)
		}
	case *storepb.GetReplicaListResponse:
		m.lookup(v)
	case *storepb.BatchGetReplicaListResponse:
		for _, it := range v.GetItems() {
			m.lookup(it)
		}
	}
}

// lookup counts one key's GetReplicaList answer: a hit in DRAM when a
// replica is there (readers take DRAM first), else in an SSD tier.
func (m *metrics) lookup(v *storepb.GetReplicaListResponse) {
	m.gets.Add(1)
	if storepb.Code(v.GetResult().GetCode()) != storepb.OK || len(v.GetReplicas()) == 0 {
		return
	}
	m.validGets.Add(1)
	for _, r := range v.GetReplicas() {
		if mr := r.GetMemory(); mr != nil && mr.GetMedium() == storepb.Medium_MEDIUM_DRAM {
			m.memHits.Add(1)
			m.memHitBytes.Add(v.GetValueLength())
			return
		}
	}
	m.fileHits.Add(1)
	m.fileHitBytes.Add(v.GetValueLength())
}

// outcome counts the results in a response and how many are errors; a
// call refused whole (a nil response) has none. As in Mooncake, a lookup
// of a missing key is a failure, but an existence check is not.
func outcome(resp any, exist bool) (items, failed int) {
	bad := func(r *storepb.Result) bool {
		c := storepb.Code(r.GetCode())
		return c != storepb.OK && !(exist && c == storepb.ObjectNotFound)
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
	case *storepb.PutReserveResponse:
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

package master

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The admin HTTP server answers as Mooncake's master does on its
// --metrics_port: /metrics, /health, /role, /leader, and the inspection
// endpoints below, with Mooncake's paths, parameters and bodies, so tools
// written for it work. SGLang's HiCache, for one, polls /get_all_segments
// until the body is non-empty before it uses the store.
//
// The inspection endpoints read the Service of the current term. A standby
// has none that is current, and answers 503 "not the leader" as /leader
// does: its answer would be stale, and the caller should ask the leader.

// adminHandler serves the master's HTTP endpoints.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	role := func() string {
		if s.Leading() {
			return "leader"
		}
		return "standby"
	}
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := map[string]any{"status": "ok", "role": role(), "term": s.Term()}
		if svc := s.Service(); svc != nil && s.Leading() {
			st := svc.Stats()
			body["keys"], body["segments"], body["clients"] = st.Keys, st.Segments, st.Clients
			body["capacity_bytes"], body["allocated_bytes"] = st.Capacity, st.Used
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.HandleFunc("/role", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(role() + "\n")) })
	mux.HandleFunc("/leader", func(w http.ResponseWriter, r *http.Request) {
		if s.Leading() {
			_, _ = w.Write([]byte(s.Addr() + "\n"))
			return
		}
		http.Error(w, "not the leader", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /kv_events/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.kv.status())
	})
	for path, h := range map[string]func(*Service, http.ResponseWriter, *http.Request){
		"/get_all_segments":    getAllSegments,
		"/query_segment":       querySegment,
		"/get_segments_detail": getSegmentsDetail,
		"/get_all_keys":        getAllKeys,
		"/query_key":           queryKey,
		"/batch_query_keys":    batchQueryKeys,
	} {
		mux.HandleFunc("GET "+path, s.leaderOnly(h))
	}
	return s.withTenants(mux) // admin_tenant.go
}

// limitBody reads a request's body, up to max bytes, before h sees it: a
// longer one is answered 413, whether its length was declared or not, so
// that no client can make the server hold or read more than max bytes of
// a request's body.
func limitBody(max int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tooLarge := func() {
			http.Error(w, fmt.Sprintf("request body over the limit of %d bytes", max), http.StatusRequestEntityTooLarge)
		}
		if r.ContentLength > max {
			tooLarge()
			return
		}
		if r.ContentLength != 0 { // -1: a chunked body of unknown length
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				tooLarge()
				return
			}
			if err != nil {
				http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, r)
	})
}

// leaderOnly runs h on the current term's Service, on the leader only.
func (s *Server) leaderOnly(h func(*Service, http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		svc := s.Service()
		if svc == nil || !s.Leading() {
			http.Error(w, "not the leader", http.StatusServiceUnavailable)
			return
		}
		h(svc, w, r)
	}
}

// Mooncake's text endpoints answer in Prometheus' text content type.
const textType = "text/plain; version=0.0.4"

func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", textType)
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // keys go out as they are, as Mooncake's do
	_ = enc.Encode(v)
}

// getAllSegments lists the name of every mounted segment, one a line (a
// client mounting several segments under one name appears once for each);
// nothing at all while none is mounted.
func getAllSegments(svc *Service, w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	for _, sg := range svc.dramSegments() {
		b.WriteString(sg.name)
		b.WriteByte('\n')
	}
	writeText(w, http.StatusOK, b.String())
}

// querySegment reports the bytes used and the capacity of the segments
// named by ?segment=, in Mooncake's three lines.
func querySegment(svc *Service, w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("segment")
	if name == "" {
		writeText(w, http.StatusBadRequest, "missing query parameter segment (?segment=<name>)\n")
		return
	}
	var used, capacity uint64
	found := false
	for _, sg := range svc.dramSegments() {
		if sg.name == name {
			used, capacity, found = used+sg.used, capacity+sg.size, true
		}
	}
	if !found {
		writeText(w, http.StatusNotFound, fmt.Sprintf("Failed to query segment %s: %v\n", name, storepb.SegmentNotFound))
		return
	}
	writeText(w, http.StatusOK, fmt.Sprintf("%s\nUsed(bytes): %d\nCapacity(bytes) : %d\n", name, used, capacity))
}

// segmentDetail is one segment of /get_segments_detail, with Mooncake's
// field names.
type segmentDetail struct {
	SegmentName            string  `json:"segment_name"`
	SegmentID              string  `json:"segment_id"`
	ClientID               string  `json:"client_id"`
	BaseAddress            string  `json:"base_address"`
	SizeBytes              uint64  `json:"size_bytes"`
	SizeHuman              string  `json:"size_human"`
	TEEndpoint             string  `json:"te_endpoint"`
	Protocol               string  `json:"protocol"`
	Status                 string  `json:"status"`
	AllocatorUsedBytes     uint64  `json:"allocator_used_bytes"`
	AllocatorCapacityBytes uint64  `json:"allocator_capacity_bytes"`
	AllocatorUsagePercent  float64 `json:"allocator_usage_percent"`
}

func getSegmentsDetail(svc *Service, w http.ResponseWriter, _ *http.Request) {
	segs := svc.dramSegments()
	out := make([]segmentDetail, len(segs))
	for i, sg := range segs {
		out[i] = segmentDetail{
			SegmentName: sg.name, SegmentID: sg.id, ClientID: sg.client,
			BaseAddress: "0x" + strconv.FormatUint(sg.base, 16), SizeBytes: sg.size,
			// Mooncake prints the GiB with C++'s default six significant digits.
			SizeHuman:  strconv.FormatFloat(float64(sg.size)/(1<<30), 'g', 6, 64) + " GiB",
			TEEndpoint: sg.endpoint, Protocol: sg.protocol, Status: "OK",
			AllocatorUsedBytes: sg.used, AllocatorCapacityBytes: sg.size,
			AllocatorUsagePercent: float64(sg.used) / float64(sg.size) * 100,
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"total_segments": len(out), "segments": out})
}

// getAllKeys lists the readable keys, one a line.
func getAllKeys(svc *Service, w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	for _, k := range svc.readableKeys() {
		b.WriteString(k)
		b.WriteByte('\n')
	}
	writeText(w, http.StatusOK, b.String())
}

// bufferDescriptor is a replica as Mooncake's AllocatedBuffer::Descriptor
// serialises to JSON.
type bufferDescriptor struct {
	Size              uint64 `json:"size_"`
	BufferAddress     uint64 `json:"buffer_address_"`
	Protocol          string `json:"protocol_"`
	TransportEndpoint string `json:"transport_endpoint_"`
}

// replicasOf describes key's DRAM replicas; the error is a store error
// (INVALID_PARAMS, OBJECT_NOT_FOUND).
func replicasOf(svc *Service, key string) ([]bufferDescriptor, error) {
	reps, err := svc.peek(key)
	if err != nil {
		return nil, err
	}
	out := make([]bufferDescriptor, len(reps))
	for i, r := range reps {
		out[i] = bufferDescriptor{Size: r.size, BufferAddress: r.seg.base + r.off,
			Protocol: r.seg.protocol, TransportEndpoint: r.seg.endpoint}
	}
	return out, nil
}

// adminError is Mooncake's JSON error body.
type adminError struct {
	Success bool   `json:"success"`
	Code    int32  `json:"error_code"`
	Message string `json:"error_message"`
}

// queryKey describes the DRAM replicas of ?key=. A key that is not
// readable is 404 with Mooncake's body.
func queryKey(svc *Service, w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("key") {
		writeJSON(w, http.StatusBadRequest, adminError{Code: int32(storepb.InvalidParams),
			Message: "missing query parameter key (?key=<key>)"})
		return
	}
	descs, err := replicasOf(svc, q.Get("key"))
	if err != nil {
		c := codeOf(err)
		status := http.StatusNotFound
		if c == storepb.InvalidParams {
			status = http.StatusBadRequest
		}
		writeJSON(w, status, adminError{Code: int32(c), Message: c.String()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": descs})
}

// codeOf is the store error code of err (INTERNAL for another error).
func codeOf(err error) storepb.Code { return storepb.Code(storepb.NewResult(err).Code) }

// batchItem is one key's answer in /batch_query_keys.
type batchItem struct {
	OK     bool                `json:"ok"`
	Error  string              `json:"error,omitempty"`
	Values *[]bufferDescriptor `json:"values,omitempty"` // present, maybe empty, when OK
}

// batchQueryKeys is queryKey for the comma-separated keys of ?keys=, each
// answered apart.
func batchQueryKeys(svc *Service, w http.ResponseWriter, r *http.Request) {
	list := r.URL.Query().Get("keys")
	if list == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false,
			"error": "No keys provided. Use ?keys=key1,key2,..."})
		return
	}
	data := map[string]batchItem{}
	for _, key := range strings.Split(list, ",") {
		descs, err := replicasOf(svc, key)
		if err != nil {
			data[key] = batchItem{Error: codeOf(err).String()}
			continue
		}
		data[key] = batchItem{OK: true, Values: &descs}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "data": data})
}

// segmentView is a mounted segment as the admin server reports it.
type segmentView struct {
	id, name, client, endpoint, protocol string
	base, size, used                     uint64
}

// dramSegments returns the mounted DRAM segments by name, then id. SSD
// tiers are left out, as Mooncake's admin server lists memory segments
// only.
func (s *Service) dramSegments() []segmentView {
	s.segMu.Lock()
	out := make([]segmentView, 0, len(s.segList))
	for _, sg := range s.segList {
		if sg.medium == storepb.Medium_MEDIUM_DRAM {
			out = append(out, segmentView{id: sg.id, name: sg.name, client: sg.client, endpoint: sg.endpoint,
				protocol: sg.protocol, base: sg.base, size: sg.size, used: sg.alloc.Used()})
		}
	}
	s.segMu.Unlock()
	slices.SortFunc(out, func(a, b segmentView) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.id, b.id)) })
	return out
}

// readableKeys returns the keys of the readable objects, sorted; keys of a
// first put still in flight are not readable yet.
func (s *Service) readableKeys() []string {
	var keys []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, o := range sh.objects {
			if o.complete() {
				keys = append(keys, k)
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(keys)
	return keys
}

// peek returns key's readable DRAM replicas as GetReplicaList finds them,
// but grants no lease and starts no promotion: looking must not change what
// eviction and the tiers do. The replicas are copies.
func (s *Service) peek(key string) ([]replica, error) {
	if err := s.checkKey(key); err != nil {
		return nil, err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, reps, err := readableLocked(sh, key)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(reps, func(r replica) bool { return r.seg.medium != storepb.Medium_MEDIUM_DRAM }), nil
}

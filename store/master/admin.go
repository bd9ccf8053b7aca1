package master

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// The admin HTTP server answers as Mooncake's master does on its
// --metrics_port: /metrics, /metrics/summary, /health, /role, /ha_status,
// /leader, the inspection endpoints below and the /api/v1 ones
// (admin_ops.go, admin_drain.go), with Mooncake's paths, methods,
// parameters, status codes and bodies (docs/master-http.md), so tools
// written for it work. SGLang's HiCache, for one, polls /get_all_segments
// until the body is non-empty before it uses the store. A path it does
// not serve, or a method an endpoint does not take, is 404 "404 Not Found"
// as there.
//
// The inspection endpoints read the Service of the current term. A standby
// has none that is current, and answers 503 "not the leader": its answer
// would be stale, and the caller should ask the leader (/leader names it).

// adminHandler serves the master's HTTP endpoints.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	get := func(path string, h http.HandlerFunc) { mux.HandleFunc(path, only(http.MethodGet, h)) }
	post := func(path string, h http.HandlerFunc) { mux.HandleFunc(path, only(http.MethodPost, h)) }
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { notFound(w) })
	get("/metrics", officialText(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})))
	get("/metrics/summary", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, s.metrics.summary())
	})
	get("/health", s.health)
	get("/role", func(w http.ResponseWriter, _ *http.Request) { writePlain(w, s.role()) })
	get("/ha_status", func(w http.ResponseWriter, _ *http.Request) { writePlain(w, s.haState()) })
	get("/readyz", s.readyz)
	get("/leader", s.leader)
	get("/kv_events/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.kv.status())
	})
	for path, h := range map[string]func(*Service, http.ResponseWriter, *http.Request){
		"/get_all_segments":        getAllSegments,
		"/query_segment":           querySegment,
		"/get_segments_detail":     getSegmentsDetail,
		"/get_all_keys":            getAllKeys,
		"/query_key":               queryKey,
		"/batch_query_keys":        batchQueryKeys,
		"/api/v1/segments/status":  segmentStatus,
		"/api/v1/drain_jobs/query": queryDrainJob,
	} {
		get(path, s.leaderOnly(h))
	}
	for path, h := range map[string]func(*Service, http.ResponseWriter, *http.Request){
		"/api/v1/drain_jobs":        createDrainJob,
		"/api/v1/drain_jobs/cancel": cancelDrainJob,
		"/api/v1/remove_all":        s.removeAll,
	} {
		post(path, s.leaderOnly(h))
	}
	return s.withTenants(mux) // admin_tenant.go
}

// officialText serves h's Prometheus text as Mooncake's master does:
// format 0.0.4 whatever the request accepts (no OpenMetrics, protobuf or
// gzip), under its content type "text/plain; version=0.0.4".
func officialText(h http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r = r.Clone(r.Context())
		r.Header.Del("Accept")
		r.Header.Del("Accept-Encoding")
		h.ServeHTTP(textTypeWriter{w}, r)
	}
}

// textTypeWriter sets Mooncake's text content type on the answer.
type textTypeWriter struct{ http.ResponseWriter }

func (t textTypeWriter) WriteHeader(code int) {
	t.Header().Set("Content-Type", textType)
	t.ResponseWriter.WriteHeader(code)
}

func (t textTypeWriter) Write(b []byte) (int, error) {
	t.Header().Set("Content-Type", textType) // no effect once the header is out
	return t.ResponseWriter.Write(b)
}

// only serves h for one method; another is Mooncake's 404.
func only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			notFound(w)
			return
		}
		h(w, r)
	}
}

// notFound is Mooncake's answer to a path or method it does not serve:
// the bare text, with no content type.
func notFound(w http.ResponseWriter) {
	w.Header()["Content-Type"] = nil // no sniffed type either
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("404 Not Found"))
}

// role is "leader" or "standby", as /role and /health say.
func (s *Server) role() string {
	if s.Leading() {
		return "leader"
	}
	return "standby"
}

// readyz answers GET /readyz, ours: 200 "ok" while this master serves
// (leads, or runs without HA), 503 "standby" otherwise. It is the
// readiness probe that makes a Kubernetes Service reach the leader alone,
// and one of the endpoints --auth_open_probes leaves open, as a kubelet
// cannot present a token.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.Leading() {
		writeText(w, http.StatusServiceUnavailable, "standby")
		return
	}
	writeText(w, http.StatusOK, "ok")
}

// haState is Mooncake's HA state name: "serving" while leading.
func (s *Server) haState() string {
	if s.Leading() {
		return "serving"
	}
	return "standby"
}

// health is Mooncake's /health body, its fields first, then ours (the
// term, and the pool's size while leading).
type health struct {
	Status        string  `json:"status"`
	Role          string  `json:"role"`
	HAState       string  `json:"ha_state"`
	ServiceReady  bool    `json:"service_ready"`
	LeaderAddress *string `json:"leader_address"`
	ViewVersion   *int64  `json:"view_version"`

	Term           int64   `json:"term"`
	Keys           *int    `json:"keys,omitempty"`
	Segments       *int    `json:"segments,omitempty"`
	Clients        *int    `json:"clients,omitempty"`
	CapacityBytes  *uint64 `json:"capacity_bytes,omitempty"`
	AllocatedBytes *uint64 `json:"allocated_bytes,omitempty"`
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	v := s.view(r.Context())
	body := health{Status: "ok", Role: s.role(), HAState: s.haState(), ServiceReady: s.Leading(),
		LeaderAddress: v.LeaderAddress, ViewVersion: v.ViewVersion, Term: s.Term()}
	if svc := s.Service(); svc != nil && s.Leading() {
		st := svc.Stats()
		body.Keys, body.Segments, body.Clients = &st.Keys, &st.Segments, &st.Clients
		body.CapacityBytes, body.AllocatedBytes = &st.Capacity, &st.Used
	}
	writeJSON(w, http.StatusOK, body)
}

// leaderView is Mooncake's /leader body. Without HA there is no view:
// present is false and the rest null, as there.
type leaderView struct {
	Present       bool    `json:"present"`
	LeaderAddress *string `json:"leader_address"`
	ViewVersion   *int64  `json:"view_version"`
}

// view is the leader as this master knows it: itself while leading, else
// what the HA store says (nothing while no master leads, or without HA).
func (s *Server) view(ctx context.Context) leaderView {
	if s.cfg.HA == nil {
		return leaderView{}
	}
	if s.Leading() {
		addr, term := s.advertise(), s.Term()
		return leaderView{Present: true, LeaderAddress: &addr, ViewVersion: &term}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addr, term, err := ha.Leader(ctx, s.etcd, s.cfg.HA.ClusterID)
	if err != nil || addr == "" {
		return leaderView{}
	}
	return leaderView{Present: true, LeaderAddress: &addr, ViewVersion: &term}
}

func (s *Server) leader(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.view(r.Context()))
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

// writePlain answers 200 with a short word (/role, /ha_status), in the
// content type Mooncake gives those.
func writePlain(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(body))
}

func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", textType)
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// writeJSON answers v as Mooncake does: compact, with no newline after,
// and keys as they are (no HTML escaping). Bodies are structs, whose
// fields keep Mooncake's order.
func writeJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
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
// named by ?segment=, in Mooncake's three lines. A name that is missing or
// mounts nothing is Mooncake's 500 "Failed to query segment".
func querySegment(svc *Service, w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("segment")
	var used, capacity uint64
	found := false
	for _, sg := range svc.dramSegments() {
		if sg.name == name {
			used, capacity, found = used+sg.used, capacity+sg.size, true
		}
	}
	if !found {
		writeText(w, http.StatusInternalServerError, "Failed to query segment")
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
	// Ours: while a segment mounted again takes no new replicas
	// (--remount_hold_sec), what is left of that, in milliseconds.
	HeldForMs int64 `json:"held_for_ms,omitempty"`
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
			TEEndpoint: sg.endpoint, Protocol: sg.protocol, Status: segStatusNames[cmp.Or(int(sg.drain), segmentOK)],
			AllocatorUsedBytes: sg.used, AllocatorCapacityBytes: sg.size,
			AllocatorUsagePercent: float64(sg.used) / float64(sg.size) * 100,
			HeldForMs:             int64((sg.heldFor + time.Millisecond - 1) / time.Millisecond), // under 1 ms shows 1
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Total    int             `json:"total_segments"`
		Segments []segmentDetail `json:"segments"`
	}{len(out), out})
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

// replicasOf describes key's DRAM replicas, a striped one as its pieces in
// order (as Mooncake describes a replica cut into slices); the error is a
// store error (INVALID_PARAMS, OBJECT_NOT_FOUND).
func replicasOf(svc *Service, key string) ([]bufferDescriptor, error) {
	reps, err := svc.peek(key)
	if err != nil {
		return nil, err
	}
	out := make([]bufferDescriptor, 0, len(reps))
	for _, r := range reps {
		r.pieces(func(p replica) {
			out = append(out, bufferDescriptor{Size: p.size, BufferAddress: p.seg.base + p.off,
				Protocol: p.seg.protocol, TransportEndpoint: p.seg.endpoint})
		})
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
// readable is 404 with Mooncake's body; so is a missing or empty ?key=, as
// there (no object has that key).
func queryKey(svc *Service, w http.ResponseWriter, r *http.Request) {
	descs, err := replicasOf(svc, r.URL.Query().Get("key"))
	if err != nil {
		c := codeOf(err)
		status := http.StatusInternalServerError
		switch c {
		case storepb.ObjectNotFound:
			status = http.StatusNotFound
		case storepb.InvalidParams: // the empty key, or one over the length limit: no such object
			status, c = http.StatusNotFound, storepb.ObjectNotFound
		}
		writeJSON(w, status, adminError{Code: int32(c), Message: c.String()})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Success bool               `json:"success"`
		Data    []bufferDescriptor `json:"data"`
	}{true, descs})
}

// codeOf is the store error code of err (INTERNAL for another error).
func codeOf(err error) storepb.Code { return storepb.Code(storepb.NewResult(err).Code) }

// batchItem is one key's answer in /batch_query_keys, with every field
// Mooncake's has: error null when ok, values null when not. Mooncake's
// disk, local-disk and NVMe-oF replica lists are null: the replicas in
// our SSD tiers are not in Mooncake's file formats (values lists DRAM).
type batchItem struct {
	OK              bool                `json:"ok"`
	Error           *string             `json:"error"`
	Values          *[]bufferDescriptor `json:"values"`
	DiskValues      *[]struct{}         `json:"disk_values"`
	LocalDiskValues *[]struct{}         `json:"local_disk_values"`
	NoFValues       *[]struct{}         `json:"nof_values"`
}

// batchQueryKeys is queryKey for the comma-separated keys of ?keys=, each
// answered apart.
func batchQueryKeys(svc *Service, w http.ResponseWriter, r *http.Request) {
	list := r.URL.Query().Get("keys")
	if list == "" {
		writeJSON(w, http.StatusBadRequest, struct {
			Success bool   `json:"success"`
			Error   string `json:"error"`
		}{false, "No keys provided. Use ?keys=key1,key2,..."})
		return
	}
	data := map[string]batchItem{}
	for _, key := range strings.Split(list, ",") {
		descs, err := replicasOf(svc, key)
		if err != nil {
			msg := codeOf(err).String()
			data[key] = batchItem{Error: &msg}
			continue
		}
		data[key] = batchItem{OK: true, Values: &descs}
	}
	// A map's keys go out sorted, as Mooncake's do.
	writeJSON(w, http.StatusOK, struct {
		Success bool                 `json:"success"`
		Data    map[string]batchItem `json:"data"`
	}{true, data})
}

// segmentView is a mounted segment as the admin server reports it.
type segmentView struct {
	id, name, client, endpoint, protocol string
	base, size, used                     uint64
	drain                                uint8         // 0, or segDraining, segDrained
	heldFor                              time.Duration // what is left of a hold after a remount
}

// dramSegments returns the mounted DRAM segments by name, then id. SSD
// tiers are left out, as Mooncake's admin server lists memory segments
// only.
func (s *Service) dramSegments() []segmentView {
	s.segMu.Lock()
	out := make([]segmentView, 0, len(s.segList))
	for _, sg := range s.segList {
		if sg.medium == storepb.Medium_MEDIUM_DRAM {
			v := segmentView{id: sg.id, name: sg.name, client: sg.client, endpoint: sg.endpoint,
				protocol: sg.protocol, base: sg.base, size: sg.size, used: sg.alloc.Used(), drain: sg.drain}
			if s.heldLocked(sg) {
				v.heldFor = sg.heldUntil.Sub(s.now())
			}
			out = append(out, v)
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

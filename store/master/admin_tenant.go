package master

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// The admin server's tenant endpoints (Mooncake's /api/v1/tenant_quotas):
//
//	GET    /api/v1/tenant_quotas[?tenant_id=t]  every tenant's quota and charge, or t's
//	PUT    /api/v1/tenant_quotas                {"tenant_id": t, "quota_bytes": n} (or the same as query parameters)
//	DELETE /api/v1/tenant_quotas?tenant_id=t    lifts t's quota
//
// and the tenant's view of the key inspection endpoints: /get_all_keys,
// /query_key and /batch_query_keys take ?tenant_id= (default: "default")
// and see that tenant's keys only, named as its clients name them.

// withTenants wraps the admin handler next with the tenant endpoints, and
// registers the tenant metrics.
func (s *Server) withTenants(next http.Handler) http.Handler {
	s.metrics.reg.MustRegister(tenantCollector{s})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/tenant_quotas", s.leaderOnly(getTenantQuotas))
	mux.HandleFunc("PUT /api/v1/tenant_quotas", s.leaderOnly(putTenantQuota))
	mux.HandleFunc("DELETE /api/v1/tenant_quotas", s.leaderOnly(deleteTenantQuota))
	mux.Handle("GET /get_all_keys", tenantView(next, unscopeLines))
	mux.Handle("GET /query_key", tenantView(next, nil))
	mux.Handle("GET /batch_query_keys", tenantView(next, unscopeBatch))
	mux.Handle("/", next)
	return mux
}

// tenantError answers msg as a JSON error with the HTTP status code.
func tenantError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"success": false, "error": msg})
}

// requestTenant is ?tenant_id=, DefaultTenant when absent.
func requestTenant(q url.Values) (string, error) {
	t := q.Get("tenant_id")
	if t == "" {
		return DefaultTenant, nil
	}
	return t, CheckTenant(t)
}

func getTenantQuotas(svc *Service, w http.ResponseWriter, r *http.Request) {
	all := svc.TenantUsage()
	if !r.URL.Query().Has("tenant_id") {
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "tenants": all})
		return
	}
	t, err := requestTenant(r.URL.Query())
	if err != nil {
		tenantError(w, http.StatusBadRequest, err.Error())
		return
	}
	u := TenantUsage{Tenant: t}
	for _, x := range all {
		if x.Tenant == t {
			u = x
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "tenants": []TenantUsage{u}})
}

// quotaRequest is a PUT's body.
type quotaRequest struct {
	Tenant string `json:"tenant_id"`
	Quota  uint64 `json:"quota_bytes"`
}

func putTenantQuota(svc *Service, w http.ResponseWriter, r *http.Request) {
	var req quotaRequest
	q := r.URL.Query()
	if q.Has("tenant_id") || q.Has("quota_bytes") {
		n, err := strconv.ParseUint(q.Get("quota_bytes"), 10, 64)
		if err != nil {
			tenantError(w, http.StatusBadRequest, "quota_bytes: "+err.Error())
			return
		}
		req = quotaRequest{Tenant: q.Get("tenant_id"), Quota: n}
	} else {
		body, _ := io.ReadAll(r.Body)
		d := json.NewDecoder(bytes.NewReader(body))
		d.DisallowUnknownFields()
		if err := d.Decode(&req); err != nil {
			tenantError(w, http.StatusBadRequest, `body: want {"tenant_id": "<tenant>", "quota_bytes": <bytes>}: `+err.Error())
			return
		}
	}
	if err := svc.cfg.Tenants.Set(req.Tenant, req.Quota); err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, errQuotaStore) {
			code = http.StatusInternalServerError
		}
		tenantError(w, code, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "tenant_id": req.Tenant, "quota_bytes": req.Quota})
}

func deleteTenantQuota(svc *Service, w http.ResponseWriter, r *http.Request) {
	t := r.URL.Query().Get("tenant_id")
	had, err := svc.cfg.Tenants.Delete(t)
	switch {
	case errors.Is(err, errQuotaStore):
		tenantError(w, http.StatusInternalServerError, err.Error())
	case err != nil:
		tenantError(w, http.StatusBadRequest, err.Error())
	case !had:
		tenantError(w, http.StatusNotFound, "tenant "+strconv.Quote(t)+" has no quota")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "tenant_id": t})
	}
}

// tenantView serves an inspection endpoint of next for ?tenant_id=: the
// keys of the request (key, keys) are scoped to the tenant, and fix, when
// set, rewrites next's answer for the tenant.
func tenantView(next http.Handler, fix func(t string, body []byte) []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		t, err := requestTenant(q)
		if err != nil {
			tenantError(w, http.StatusBadRequest, err.Error())
			return
		}
		q.Del("tenant_id")
		if q.Has("key") {
			q.Set("key", scopeKey(t, q.Get("key")))
		}
		if q.Has("keys") && q.Get("keys") != "" {
			q.Set("keys", strings.Join(scopeKeys(t, strings.Split(q.Get("keys"), ",")), ","))
		}
		r2 := r.Clone(r.Context())
		r2.URL.RawQuery = q.Encode()
		if fix == nil {
			next.ServeHTTP(w, r2)
			return
		}
		rec := &recorder{header: http.Header{}, code: http.StatusOK}
		next.ServeHTTP(rec, r2)
		body := rec.body.Bytes()
		if rec.code == http.StatusOK {
			body = fix(t, body)
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.code)
		_, _ = w.Write(body)
	})
}

// recorder keeps an answer for tenantView to rewrite.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// unscopeLines keeps tenant t's keys of a key-a-line listing.
func unscopeLines(t string, body []byte) []byte {
	var b bytes.Buffer
	for line := range strings.Lines(string(body)) {
		if tt, k := splitKey(strings.TrimSuffix(line, "\n")); tt == t {
			b.WriteString(k)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// unscopeBatch names the keys of a /batch_query_keys answer as tenant t's
// clients do.
func unscopeBatch(_ string, body []byte) []byte {
	var resp map[string]json.RawMessage
	var data map[string]json.RawMessage
	if json.Unmarshal(body, &resp) != nil || json.Unmarshal(resp["data"], &data) != nil {
		return body
	}
	out := make(map[string]json.RawMessage, len(data))
	for sk, v := range data {
		_, k := splitKey(sk)
		out[k] = v
	}
	resp["data"], _ = json.Marshal(out)
	b, err := json.Marshal(resp)
	if err != nil {
		return body
	}
	return append(b, '\n')
}

// tenantCollector exports the tenants' quotas and charges under Mooncake's
// names (mooncake_tenant_quota_*, mooncake_tenant_evict_bytes_total).
type tenantCollector struct{ s *Server }

var (
	tenantQuotaDesc = prometheus.NewDesc("mooncake_tenant_quota_effective_bytes",
		"Effective tenant quota in bytes.", []string{"tenant_id"}, nil)
	tenantRequestedDesc = prometheus.NewDesc("mooncake_tenant_quota_requested_bytes",
		"Requested tenant quota policy in bytes.", []string{"tenant_id"}, nil)
	tenantChargedDesc = prometheus.NewDesc("mooncake_tenant_quota_charged_bytes",
		"Tenant quota charge in bytes: its DRAM replicas, puts in flight included.", []string{"tenant_id"}, nil)
	tenantOverDesc = prometheus.NewDesc("mooncake_tenant_quota_over_quota",
		"1 while the tenant holds more than its quota.", []string{"tenant_id"}, nil)
	tenantExplicitDesc = prometheus.NewDesc("mooncake_tenant_quota_explicit_policy",
		"1 when the tenant has a quota of its own.", []string{"tenant_id"}, nil)
	tenantRejectDesc = prometheus.NewDesc("mooncake_tenant_quota_reject_total",
		"Puts refused for their tenant's quota.", nil, nil)
	tenantEvictDesc = prometheus.NewDesc("mooncake_tenant_evict_bytes_total",
		"Bytes evicted from a tenant to admit its own puts within its quota.", []string{"tenant_id"}, nil)
)

func (tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tenantQuotaDesc, tenantRequestedDesc, tenantChargedDesc, tenantOverDesc,
		tenantExplicitDesc, tenantRejectDesc, tenantEvictDesc} {
		ch <- d
	}
}

func (c tenantCollector) Collect(ch chan<- prometheus.Metric) {
	svc := c.s.Service()
	if svc == nil || !c.s.Leading() {
		return
	}
	var rejects uint64
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, u := range svc.TenantUsage() {
		rejects += u.Rejects
		ch <- prometheus.MustNewConstMetric(tenantChargedDesc, prometheus.GaugeValue, float64(u.Charged), u.Tenant)
		ch <- prometheus.MustNewConstMetric(tenantEvictDesc, prometheus.CounterValue, float64(u.EvictedBytes), u.Tenant)
		ch <- prometheus.MustNewConstMetric(tenantExplicitDesc, prometheus.GaugeValue, b(u.Quota > 0), u.Tenant)
		ch <- prometheus.MustNewConstMetric(tenantOverDesc, prometheus.GaugeValue, b(u.OverQuota), u.Tenant)
		if u.Quota > 0 {
			ch <- prometheus.MustNewConstMetric(tenantQuotaDesc, prometheus.GaugeValue, float64(u.Quota), u.Tenant)
			ch <- prometheus.MustNewConstMetric(tenantRequestedDesc, prometheus.GaugeValue, float64(u.Quota), u.Tenant)
		}
	}
	ch <- prometheus.MustNewConstMetric(tenantRejectDesc, prometheus.CounterValue, float64(rejects))
}

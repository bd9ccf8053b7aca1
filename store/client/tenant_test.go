package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func tenant(id string) func(*Config) { return func(c *Config) { c.TenantID = id } }

// Two tenants, and a client that names none (the default tenant, as every
// client older than tenants), use the same keys through one master and
// never see, read, list or remove each other's objects.
func TestTenantsNeverSeeEachOther(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 8<<20, tenant("a"))
	b := newClient(t, m.Addr(), 8<<20, tenant("b"))
	d := newClient(t, m.Addr(), 8<<20) // no tenant: "default"
	ctx := ctxT(t)
	clients := map[string]*Client{"a": a, "b": b, "default": d}
	val := func(who, key string) []byte { return []byte(who + "/" + key + strings.Repeat("x", 100)) }

	for who, c := range clients {
		require.NoError(t, c.Put(ctx, "k", val(who, "k"), nil), who)
		for i, err := range c.BatchPut(ctx, []string{"x1", "x2"}, [][]byte{val(who, "x1"), val(who, "x2")}, nil) {
			require.NoError(t, err, "%s item %d", who, i)
		}
	}
	// Only a has "only-a".
	require.NoError(t, a.Put(ctx, "only-a", val("a", "only-a"), nil))
	for who, c := range clients {
		got, err := c.Get(ctx, "k")
		require.NoError(t, err, who)
		assert.Equal(t, val(who, "k"), got, "%s reads its own k", who)
		vals, errs := c.BatchGet(ctx, []string{"x1", "x2"})
		for i, k := range []string{"x1", "x2"} {
			require.NoError(t, errs[i], who)
			assert.Equal(t, val(who, k), vals[i], "%s reads its own %s", who, k)
		}
		ok, err := c.Exist(ctx, "only-a")
		require.NoError(t, err)
		assert.Equal(t, who == "a", ok, "%s sees only-a", who)
	}
	_, err := b.Get(ctx, "only-a")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound, "b reads a's object")
	err = a.Put(ctx, "only-a", val("a", "again"), nil) // exists: its message names the key as a sent it
	require.NoError(t, err)
	ok, err := a.Exist(ctx, "only-a")
	require.NoError(t, err)
	require.True(t, ok)
	err = a.Remove(ctx, "only-a", false) // leased by the Exist
	require.ErrorIs(t, err, storepb.ErrObjectHasLease)
	assert.Contains(t, err.Error(), `"only-a"`)
	assert.NotContains(t, err.Error(), `\x00`, "the message shows the tenant's prefix")
	require.ErrorIs(t, b.Remove(ctx, "only-a", true), storepb.ErrObjectNotFound, "b removes a's object")

	// Removals stay within the tenant: by key, by pattern, all.
	require.NoError(t, a.Remove(ctx, "k", true))
	n, err := b.RemoveByRegex(ctx, "^x", true)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "b's pattern matches b's two keys only")
	n, err = d.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "the default tenant's RemoveAll removes its three objects only")

	has := func(c *Client, key string) bool {
		ok, err := c.Exist(ctx, key)
		require.NoError(t, err)
		return ok
	}
	assert.False(t, has(a, "k"))
	assert.True(t, has(b, "k"), "a's Remove took b's k")
	assert.True(t, has(a, "x1"), "b's RemoveByRegex took a's x1")
	assert.False(t, has(b, "x1"))
	assert.True(t, has(a, "only-a"), "the default tenant's RemoveAll took a's object")
	assert.True(t, has(b, "k"))
	assert.False(t, has(d, "k"))
}

// A tenant over its quota is refused with TENANT_QUOTA_EXCEEDED naming the
// tenant and its quota, while a tenant without one puts on; making room for
// a tenant evicts its own oldest objects, never another tenant's, even
// older ones.
func TestTenantQuota(t *testing.T) {
	quotas, err := master.NewTenantQuotas(nil)
	require.NoError(t, err)
	require.NoError(t, quotas.Set("small", 100<<10))
	m := startMaster(t, master.ServiceConfig{Tenants: quotas})
	small := newClient(t, m.Addr(), 4<<20, tenant("small"))
	big := newClient(t, m.Addr(), 4<<20, tenant("big"))
	ctx := ctxT(t)

	// big's object is the oldest in the pool: global LRU would take it first.
	require.NoError(t, big.Put(ctx, "old", value(1, 60<<10), nil))
	require.NoError(t, small.Put(ctx, "s1", value(2, 60<<10), nil))
	// s2 does not fit beside s1: s1, small's own, is evicted for it.
	require.NoError(t, small.Put(ctx, "s2", value(3, 60<<10), nil))
	ok, err := small.Exist(ctx, "s1")
	require.NoError(t, err)
	assert.False(t, ok, "s1 should have made room for s2")
	got, err := big.Get(ctx, "old")
	require.NoError(t, err, "small's quota evicted big's object")
	assert.Equal(t, value(1, 60<<10), got)

	// s2 is leased now (the Exist above, and this Get): nothing of small's
	// may go, so s3 is refused.
	_, err = small.Get(ctx, "s2")
	require.NoError(t, err)
	err = small.Put(ctx, "s3", value(4, 60<<10), nil)
	require.ErrorIs(t, err, storepb.ErrTenantQuotaExceeded)
	assert.Contains(t, err.Error(), `tenant "small"`)
	assert.Contains(t, err.Error(), fmt.Sprint(100<<10))
	// More than the quota itself never fits.
	require.ErrorIs(t, small.Put(ctx, "huge", value(5, 200<<10), nil), storepb.ErrTenantQuotaExceeded)

	// big has no quota: it puts on.
	for i := range 4 {
		require.NoError(t, big.Put(ctx, fmt.Sprintf("b%d", i), value(uint64(10+i), 60<<10), nil))
	}
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b.String()
}

// Quotas are set, read and lifted over the admin server's
// /api/v1/tenant_quotas, take effect at once, and show in the metrics; the
// key listing is per tenant.
func TestTenantQuotaEndpoints(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	base := "http://" + m.AdminAddr() + "/api/v1/tenant_quotas"
	c := newClient(t, m.Addr(), 4<<20, tenant("acme"))
	d := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)

	code, body := httpDo(t, "PUT", base, `{"tenant_id": "acme", "quota_bytes": 65536}`)
	require.Equal(t, 200, code, body)
	code, body = httpDo(t, "PUT", base, `{"tenant_id": "bad tenant", "quota_bytes": 1}`)
	assert.Equal(t, 400, code, body)
	code, body = httpDo(t, "PUT", base, `{"tenant_id": "acme", "quota_bytes": 0}`)
	assert.Equal(t, 400, code, body)

	require.NoError(t, c.Put(ctx, "k", value(1, 40<<10), nil))
	require.NoError(t, d.Put(ctx, "k", value(2, 40<<10), nil))
	_, err = c.Get(ctx, "k") // leased: it cannot make room
	require.NoError(t, err)
	require.ErrorIs(t, c.Put(ctx, "k2", value(3, 40<<10), nil), storepb.ErrTenantQuotaExceeded)

	code, body = httpDo(t, "GET", base+"?tenant_id=acme", "")
	require.Equal(t, 200, code, body)
	var got struct {
		Tenants []master.TenantUsage `json:"tenants"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Tenants, 1)
	assert.Equal(t, master.TenantUsage{Tenant: "acme", Quota: 65536, Charged: 40 << 10, Keys: 1, Rejects: 1}, got.Tenants[0])

	code, body = httpDo(t, "GET", "http://"+m.AdminAddr()+"/metrics", "")
	require.Equal(t, 200, code)
	for _, want := range []string{
		`mooncake_tenant_quota_effective_bytes{tenant_id="acme"} 65536`,
		`mooncake_tenant_quota_charged_bytes{tenant_id="acme"} 40960`,
		`mooncake_tenant_quota_charged_bytes{tenant_id="default"} 40960`,
		`mooncake_tenant_quota_reject_total 1`,
	} {
		assert.Contains(t, body, want)
	}
	// Each tenant lists its own keys.
	code, body = httpDo(t, "GET", "http://"+m.AdminAddr()+"/get_all_keys?tenant_id=acme", "")
	require.Equal(t, 200, code)
	assert.Equal(t, "k\n", body)
	code, body = httpDo(t, "GET", "http://"+m.AdminAddr()+"/get_all_keys", "")
	require.Equal(t, 200, code)
	assert.Equal(t, "k\n", body, "the default tenant's listing")
	// The key inspection endpoints answer for the tenant named.
	adm := "http://" + m.AdminAddr()
	code, _ = httpDo(t, "GET", adm+"/query_key?key=k&tenant_id=acme", "")
	assert.Equal(t, 200, code)
	code, _ = httpDo(t, "GET", adm+"/query_key?key=k&tenant_id=nobody", "")
	assert.Equal(t, 404, code, "nobody has no k")
	code, body = httpDo(t, "GET", adm+"/batch_query_keys?keys=k,k2&tenant_id=acme", "")
	require.Equal(t, 200, code, body)
	var batch struct {
		Data map[string]struct {
			OK bool `json:"ok"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &batch), body)
	assert.Equal(t, map[string]bool{"k": true, "k2": false},
		map[string]bool{"k": batch.Data["k"].OK, "k2": batch.Data["k2"].OK}, body)
	assert.Len(t, batch.Data, 2, "keys named as acme's clients name them: %s", body)
	code, _ = httpDo(t, "GET", adm+"/get_all_keys?tenant_id=bad%20tenant", "")
	assert.Equal(t, 400, code)

	code, body = httpDo(t, "DELETE", base+"?tenant_id=acme", "")
	require.Equal(t, 200, code, body)
	require.NoError(t, c.Put(ctx, "k2", value(3, 40<<10), nil), "no quota after DELETE")
	code, _ = httpDo(t, "DELETE", base+"?tenant_id=acme", "")
	assert.Equal(t, 404, code, "a second DELETE finds no quota")
}

// A failover keeps the tenants apart and their quotas: the journal carries
// each object's tenant, and the new leader charges each tenant what the
// old one did.
func TestTenantsSurviveFailover(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func() *master.Server {
		quotas, err := master.NewTenantQuotas(nil)
		require.NoError(t, err)
		require.NoError(t, quotas.Set("small", 64<<10))
		s, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Service: master.ServiceConfig{Tenants: quotas},
			HA: &master.HAConfig{Etcd: []string{etcd}, ClusterID: "t", LeaderTTL: 3 * time.Second}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	m1, m2 := start(), start()
	leader := waitLeader(t, m1, m2)
	standby := m1
	if leader == m1 {
		standby = m2
	}
	ha := func(id string) func(*Config) {
		return func(c *Config) { c.Master, c.ClusterID, c.TenantID = "etcd://"+etcd, "t", id }
	}
	a := newClient(t, "", 4<<20, ha("small"))
	b := newClient(t, "", 4<<20, ha("other"))
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "k", value(1, 40<<10), nil))
	require.NoError(t, b.Put(ctx, "k", value(2, 40<<10), nil))

	require.NoError(t, leader.Close())
	require.Same(t, standby, waitLeader(t, standby))

	got, err := a.Get(ctx, "k") // and a lease: k cannot make room
	require.NoError(t, err)
	assert.Equal(t, value(1, 40<<10), got)
	got, err = b.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, value(2, 40<<10), got)
	require.ErrorIs(t, a.Put(ctx, "k2", value(3, 40<<10), nil), storepb.ErrTenantQuotaExceeded,
		"the new leader charges small its k")
	require.NoError(t, b.Put(ctx, "k2", value(4, 40<<10), nil))
}

// A tenant id the master would refuse is refused by Validate, naming it.
func TestTenantIDValidate(t *testing.T) {
	for _, id := range []string{"has space", "a\x00b", strings.Repeat("x", 200)} {
		cfg := Config{Master: "127.0.0.1:1", TenantID: id}
		err := cfg.Validate()
		require.Error(t, err, "%q", id)
		assert.Contains(t, err.Error(), "TenantID")
	}
	t.Setenv("MOONCAKE_TENANT_ID", "from-env")
	got, err := tenantOf("")
	require.NoError(t, err)
	assert.Equal(t, "from-env", got)
	got, err = tenantOf("mine")
	require.NoError(t, err)
	assert.Equal(t, "mine", got, "Config.TenantID wins over the environment")
}

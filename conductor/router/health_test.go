package router

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// health reads GET /health: its status and body.
func (h *harness) health() (int, health) {
	h.t.Helper()
	a := h.do(http.MethodGet, "/health", nil)
	var hl health
	require.NoError(h.t, json.Unmarshal(a.body, &hl), "%s", a.body)
	return a.status, hl
}

// ids of the unreachable instances of a /health answer, in order.
func unreachableIDs(hl health) []string {
	out := []string{}
	for _, u := range hl.Unreachable {
		out = append(out, u.ID)
	}
	return out
}

// /health is ready only while a prefill and a decode instance answer, and
// names the ones that do not: engines stopped one after the other (real
// servers closed), an engine that says it is unhealthy, and one that
// never answers within the probe timeout.
func TestHealthReflectsReachableInstances(t *testing.T) {
	_, es := cluster(t, 1, 2)
	p0, d0, d1 := es[0], es[1], es[2]
	// Every /health probes again: the steps below change the engines
	// between two calls.
	h := newHarness(t, nil, func(c *Config) { c.ProbeInterval = time.Nanosecond; c.ProbeTimeout = 200 * time.Millisecond },
		p0, d0, d1)

	// All up.
	status, hl := h.health()
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, health{Status: "ok", Ready: true, Prefill: 1, Decode: 2, ReachablePrefill: 1, ReachableDecode: 2,
		Unreachable: []unreachable{}}, hl)

	// One decode engine gone: still ready, and it is named with why.
	d0.srv.Close()
	status, hl = h.health()
	require.Equal(t, http.StatusOK, status)
	assert.True(t, hl.Ready)
	assert.Equal(t, 1, hl.ReachableDecode)
	require.Len(t, hl.Unreachable, 1)
	assert.Equal(t, unreachable{ID: "d0", Role: RoleDecode, URL: d0.srv.URL, Error: hl.Unreachable[0].Error}, hl.Unreachable[0])
	assert.Contains(t, hl.Unreachable[0].Error, "connection refused")

	// The other decode engine answers 503 (vLLM's dead engine loop): no
	// decode instance left, not ready, 503 with the same body.
	d1.health.Store(http.StatusServiceUnavailable)
	status, hl = h.health()
	require.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "unavailable", hl.Status)
	assert.False(t, hl.Ready)
	assert.Equal(t, 1, hl.ReachablePrefill)
	assert.Equal(t, 0, hl.ReachableDecode)
	assert.Equal(t, []string{"d0", "d1"}, unreachableIDs(hl))
	assert.Contains(t, hl.Unreachable[1].Error, "503")

	// It recovers: ready again at the next probe.
	d1.health.Store(0)
	status, hl = h.health()
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, []string{"d0"}, unreachableIDs(hl))

	// A prefill engine that accepts connections and never answers is
	// unreachable once the probe timeout passes; /health itself answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	require.NoError(t, h.router.Remove("p0"))
	require.NoError(t, h.router.Register(Instance{ID: "p1", Role: RolePrefill, URL: "http://" + silent.Addr().String()}))
	start := time.Now()
	status, hl = h.health()
	assert.Less(t, time.Since(start), 10*time.Second, "the probe is bounded")
	require.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, 0, hl.ReachablePrefill)
	assert.Equal(t, []string{"d0", "p1"}, unreachableIDs(hl), "p0 is forgotten with its registration")

	// Nothing registered: not ready.
	for _, id := range []string{"p1", "d0", "d1"} {
		require.NoError(t, h.router.Remove(id))
	}
	status, hl = h.health()
	require.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, health{Status: "unavailable", Unreachable: []unreachable{}}, hl)
}

// A probe's outcome stands for Config.ProbeInterval: polling /health does
// not probe the engines each time, while an instance registered since is
// probed at once.
func TestHealthProbesAreCached(t *testing.T) {
	_, es := cluster(t, 1, 2)
	p0, d0, d1 := es[0], es[1], es[2]
	h := newHarness(t, nil, func(c *Config) { c.ProbeInterval = time.Hour }, p0, d0)

	for range 3 {
		status, hl := h.health()
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, 2, hl.ReachablePrefill+hl.ReachableDecode)
	}
	assert.EqualValues(t, 1, p0.probes.Load(), "one probe per interval")
	assert.EqualValues(t, 1, d0.probes.Load())

	// Gone, but within the interval: the cached outcome stands.
	d0.srv.Close()
	_, hl := h.health()
	assert.Equal(t, 1, hl.ReachableDecode)

	// A new instance has no outcome yet: it is probed now.
	require.NoError(t, h.router.Register(d1.instance()))
	_, hl = h.health()
	assert.Equal(t, 2, hl.ReachableDecode)
	assert.EqualValues(t, 1, d1.probes.Load())
	assert.EqualValues(t, 1, p0.probes.Load())
}

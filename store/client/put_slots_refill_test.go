package client

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
)

// masterCounter reads one counter of m's /metrics.
func masterCounter(t *testing.T, m *master.Server, name string) int {
	t.Helper()
	resp, err := http.Get("http://" + m.AdminAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return int(n)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return 0
}

// Values so large that slotMaxBytes holds fewer than half of slotsAhead
// batches' worth of slots still get them a reserve at a time for several
// puts: refilling at half of what could never be held would reserve again
// on every put, one slot at a time (a reserve per put, on top of the
// put's commit).
func TestReserveLargeValuesNotEveryPut(t *testing.T) {
	const size = 8 << 20 // slotMaxBytes holds 8 of them, under slotsMin
	m := startAdminMaster(t)
	newClient(t, m.Addr(), 160<<20)
	w := newClient(t, m.Addr(), NoSegment, reservePuts)
	ctx := ctxT(t)
	v := value(1, size)
	require.NoError(t, w.RegisterBuffer(v))
	idle := func() bool {
		w.slots.mu.Lock()
		defer w.slots.mu.Unlock()
		return !w.slots.filling[size]
	}
	put := func(i int) {
		require.NoError(t, w.Put(ctx, "k"+strconv.Itoa(i), v, nil))
		require.Eventually(t, idle, 10*time.Second, time.Millisecond, "the reserve after put %d", i)
	}
	put(0) // no slots yet: the usual way, and the first reserve
	require.Equal(t, slotMaxBytes/size, w.slotsHeld(size))
	before := masterCounter(t, m, "master_put_reserve_requests_total")
	used := w.slots.used.Load()
	const puts = 8
	for i := 1; i <= puts; i++ {
		put(i)
	}
	require.Equal(t, used+puts, w.slots.used.Load(), "every put went into a slot")
	reserves := masterCounter(t, m, "master_put_reserve_requests_total") - before
	require.LessOrEqual(t, reserves, puts/2, "%d reserves for %d puts", reserves, puts)
}

package master

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// /metrics/summary is Mooncake's one-line summary: role and state, then
// master={...} with the pool, the request rates since the previous summary
// (per second: success/total, and for batches request success/partial/
// total and item success/total), eviction, discarded puts and promotions.
// Sections and fields for what this master does not have (NVMe-oF, the
// Mem/NoF eviction split, staging, promotion rejections, copy tasks, the
// HA op log) are left out; under HA the leader and view
// version follow.

// rateSample is one method's counters when the previous summary was made.
type rateSample struct{ requests, failures, partial, items, failedItems uint64 }

// summaryState is what the next summary computes its rates against.
type summaryState struct {
	at   time.Time
	last map[string]rateSample
}

var summaryRPCs = []struct{ label, method string }{
	{"PutStart", "PutStart"}, {"PutEnd", "PutEnd"}, {"PutRevoke", "PutRevoke"}, {"Get", "GetReplicaList"},
	{"Exist", "ExistKey"}, {"Del", "Remove"}, {"DelAll", "RemoveAll"}, {"Ping", "Ping"}, {"MoveEnd", "MoveEnd"},
}

var summaryBatchRPCs = []struct{ label, method string }{
	{"PutStart", "BatchPutStart"}, {"PutEnd", "BatchPutEnd"}, {"PutRevoke", "BatchPutRevoke"},
	{"Get", "BatchGetReplicaList"}, {"ExistKey", "BatchExistKey"},
}

// humanBytes prints n as Mooncake's summary does: "0 B", "512 B",
// "40.29 KB", "64.00 MB".
func humanBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	units := []string{"B", "KB", "MB", "GB", "TB", "PB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.2f %s", v, units[i])
}

func usage(used, capacity uint64) string {
	s := humanBytes(used) + " / " + humanBytes(capacity)
	if capacity > 0 {
		s += fmt.Sprintf(" (%.1f%%)", float64(used)/float64(capacity)*100)
	}
	return s
}

// summary renders the line and starts the next rate interval.
func (m *metrics) summary() string {
	now := time.Now()
	m.mu.Lock()
	secs := now.Sub(m.sum.at).Seconds()
	cur := make(map[string]rateSample, len(m.rpcs))
	delta := make(map[string]rateSample, len(m.rpcs))
	for method, r := range m.rpcs {
		c := rateSample{r.requests.Load(), r.failures.Load(), r.partial.Load(), r.items.Load(), r.failedItems.Load()}
		p := m.sum.last[method]
		cur[method] = c
		delta[method] = rateSample{c.requests - p.requests, c.failures - p.failures, c.partial - p.partial,
			c.items - p.items, c.failedItems - p.failedItems}
	}
	m.sum = summaryState{at: now, last: cur}
	m.mu.Unlock()
	rate := func(n uint64) string {
		if secs <= 0 {
			return "0.00"
		}
		return fmt.Sprintf("%.2f", float64(n)/secs)
	}

	srv := m.srv
	var b strings.Builder
	fmt.Fprintf(&b, "role=%s, state=%s, service_ready=%t", srv.role(), srv.haState(), srv.Leading())
	if svc := srv.Service(); svc != nil && srv.Leading() {
		st := svc.Stats()
		fmt.Fprintf(&b, ", master={Mem Storage: %s | SSD Storage: %s | Keys: %d (soft-pinned: %d) | Clients: %d",
			usage(st.Used, st.Capacity), usage(st.DiskUsed, st.DiskCapacity), st.Keys, st.SoftPinned, st.Clients)
		b.WriteString(" | Requests (Success/Total per sec): ")
		for i, r := range summaryRPCs {
			d := delta[r.method]
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s=%s/%s", r.label, rate(d.requests-d.failures), rate(d.requests))
		}
		b.WriteString(" | Batch Requests (per sec, Req=Success/PartialSuccess/Total, Item=Success/Total): ")
		for i, r := range summaryBatchRPCs {
			d := delta[r.method]
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s:(Req=%s/%s/%s, Item=%s/%s)", r.label, rate(d.requests-d.failures-d.partial),
				rate(d.partial), rate(d.requests), rate(d.items-d.failedItems), rate(d.items))
		}
		_, _, promoting := svc.tierCounts()
		fmt.Fprintf(&b, " | Eviction: Success/Attempts=%d/%d, AllocFail=%d, PartialAlloc=%d, keys=%d, size=%s",
			svc.evictSuccesses.Load(), svc.evictAttempts.Load(), st.AllocFailures, m.partialAllocs.Load(),
			st.EvictedKeys, humanBytes(st.EvictedBytes))
		fmt.Fprintf(&b, " | Discard: Released/Total=%d/%d", st.Released, st.Discarded)
		p := &svc.promo
		fmt.Fprintf(&b, " | Promotion: in_flight=%d, admitted=%d, completed=%d, failed=%d, cancelled=%d, expired=%d, bytes=%s",
			promoting, p.admitted.Load(), st.Promoted, p.failed.Load(), p.cancelled.Load(), p.expired.Load(),
			humanBytes(p.bytes.Load()))
		fmt.Fprintf(&b, " | Snapshots: Success=%d, Fail=%d}", m.snapshots.Load(), m.snapshotFails.Load())
	}
	if v := srv.view(context.Background()); v.Present {
		fmt.Fprintf(&b, ", leader=%s, view_version=%d", *v.LeaderAddress, *v.ViewVersion)
	}
	return b.String()
}

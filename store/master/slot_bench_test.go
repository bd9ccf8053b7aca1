package master

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSlotPutCycle is the master's share of a put into reserved
// slots, per object, as a batch put load drives it with the pool full: a
// reserve of a batch's slots, their commit to fresh keys, and the eviction
// of as many old objects (the watermark eviction the service's loop runs),
// all on one goroutine, without a journal or a network. cpu-ns/object is
// the goroutine's CPU time, which the machine's load moves less than the
// wall time; allocs/object and B/object are the collector's share.
func BenchmarkSlotPutCycle(b *testing.B) {
	const size, batch = 4096, 128
	for _, pool := range []int{1 << 16, 1 << 19} { // 256 MiB and 2 GiB of 4 KiB values
		b.Run(fmt.Sprintf("%dx4KiB", pool), func(b *testing.B) {
			clk := newFakeClock()
			s, err := NewService(ServiceConfig{Now: clk.Now, Seed: 1})
			require.NoError(b, err)
			require.NoError(b, s.MountSegment(b.Context(), "c1", seg("1", 0, uint64(pool)*size)))
			next := 0
			cycle := func() {
				slots, err := s.reserve(b.Context(), DefaultTenant, "c1", "", size, batch, nil, false)
				require.NoError(b, err)
				for _, sl := range slots {
					_, err := s.commitSeq(DefaultTenant, "c1", sl.name, fmt.Sprint("key-", next), 7)
					require.NoError(b, err)
					next++
				}
				clk.Advance(time.Microsecond)
				if s.needEvict.Load() {
					s.Evict()
				}
			}
			// Fill the pool past its watermark so that every cycle evicts.
			for next < 2*pool {
				cycle()
			}
			runtime.GC()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			keys := next
			b.ReportAllocs()
			c := threadCPU()
			for b.Loop() {
				cycle()
			}
			objects := float64(next - keys)
			b.ReportMetric(float64((threadCPU()-c).Nanoseconds())/objects, "cpu-ns/object")
			b.ReportMetric(objects/float64(b.N), "objects/op")
		})
	}
}

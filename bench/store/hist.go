package store

import (
	"math/bits"
	"time"
)

// histogram counts latencies in log-linear buckets, the layout of
// bench/te's: exact below 128 ns, then 64 buckets per power of two, so any
// quantile is within 1.6% of the true value, in 30 KiB whatever the run
// length.
type histogram struct {
	counts [59 << subBits]uint64
	total  uint64
}

const subBits = 6 // 64 buckets per octave

func bucketOf(v uint64) int {
	if v < 2<<subBits {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1
	return shift<<subBits + int(v>>shift)
}

// valueOf is the middle of bucket i.
func valueOf(i int) uint64 {
	if i < 2<<subBits {
		return uint64(i)
	}
	shift := i>>subBits - 1
	top := uint64(i - shift<<subBits)
	return top<<shift + 1<<(shift-1)
}

// record counts one call that took d.
func (h *histogram) record(d time.Duration) {
	h.counts[min(bucketOf(uint64(max(d, 0))), len(h.counts)-1)]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
}

// quantile returns the q-quantile (0 < q <= 1), zero when empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := min(max(uint64(q*float64(h.total)+0.5), 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return time.Duration(valueOf(i))
		}
	}
	return time.Duration(valueOf(len(h.counts) - 1))
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / 1e3 }

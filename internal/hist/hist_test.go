package hist

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	// 1..10000 µs, once each: the q-quantile is q*10 ms.
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i)*time.Microsecond, 1)
	}
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 1} {
		want := q * 10000 * float64(time.Microsecond)
		assert.InEpsilon(t, want, float64(h.Quantile(q)), 0.02, "q=%v", q)
	}
	// Weighted records count as that many requests.
	var w Histogram
	w.Record(time.Millisecond, 99)
	w.Record(time.Second, 1)
	assert.InEpsilon(t, float64(time.Millisecond), float64(w.Quantile(0.99)), 0.02)
	assert.InEpsilon(t, float64(time.Second), float64(w.Quantile(1)), 0.02)
	var empty Histogram
	assert.Zero(t, empty.Quantile(0.5))
}

func TestHistogramBuckets(t *testing.T) {
	// Every value lands in a bucket whose middle is within 1.6% of it, and
	// buckets are monotonic.
	prev := -1
	for _, v := range []uint64{0, 1, 127, 128, 129, 1000, 65535, 1 << 20, 1e9, 1 << 62, 1<<63 - 1} {
		b := bucketOf(v)
		assert.GreaterOrEqual(t, b, prev)
		assert.Less(t, b, len(Histogram{}.counts))
		prev = b
		if v > 0 {
			assert.InEpsilon(t, float64(v), float64(valueOf(b)), 0.016, "v=%d", v)
		}
	}
}

func TestNearestRank(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.2, 1}, {0.21, 2}, {0.5, 3}, {0.9, 5}, {1, 5}} {
		if got := NearestRank(v, c.q); got != c.want {
			t.Errorf("q %v: %v, want %v", c.q, got, c.want)
		}
	}
	if got := NearestRank([]int(nil), 0.5); got != 0 {
		t.Errorf("no values: %v", got)
	}
}

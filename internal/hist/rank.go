package hist

import (
	"cmp"
	"math"
	"slices"
)

// NearestRank returns the exact q-quantile of v by the nearest-rank method
// (the smallest value with at least q of them at or below it), sorting v
// in place; 0 for no values. For runs short enough to keep every value.
func NearestRank[T cmp.Ordered](v []T, q float64) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	slices.Sort(v)
	rank := int(math.Ceil(q * float64(len(v))))
	return v[min(max(rank, 1), len(v))-1]
}

package alloc

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A restored allocator behaves exactly like the one whose live set it
// copies: same used bytes, same live offsets, frees merge back to one block.
func TestRestoreAllocatorMatchesLive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a, err := New(64 << 20)
	require.NoError(t, err)
	live := map[uint64]uint64{}
	for range 5000 {
		if len(live) > 0 && r.IntN(3) == 0 {
			for off := range live {
				require.NoError(t, a.Free(off))
				delete(live, off)
				break
			}
			continue
		}
		n := uint64(1 + r.IntN(256<<10))
		if off, ok := a.Alloc(n); ok {
			live[off] = n
		}
	}
	var spans []Span
	for off, n := range live {
		spans = append(spans, Span{off, n})
	}
	b, err := Restore(64<<20, spans)
	require.NoError(t, err)
	assert.Equal(t, a.Used(), b.Used())
	assert.Equal(t, a.LargestFree(), b.LargestFree())
	for off, n := range live {
		got, ok := b.SizeOf(off)
		require.True(t, ok)
		assert.Equal(t, (n+63)&^63, got)
	}
	// New allocations never overlap restored ones.
	for range 100 {
		if off, ok := b.Alloc(4096); ok {
			for lo, n := range live {
				assert.False(t, off < lo+n && lo < off+4096, "%#x overlaps %#x+%d", off, lo, n)
			}
			require.NoError(t, b.Free(off))
		}
	}
	for off := range live {
		require.NoError(t, b.Free(off))
	}
	assert.Equal(t, uint64(0), b.Used())
	assert.Equal(t, b.Size(), b.LargestFree())
	assert.Equal(t, 1, b.Stats().FreeBlocks)
}

func TestRestoreAllocatorRejects(t *testing.T) {
	cases := []struct {
		name  string
		spans []Span
	}{
		{"overlap", []Span{{0, 128}, {64, 64}}},
		{"unaligned", []Span{{3, 64}}},
		{"outside", []Span{{1 << 20, 64}}},
		{"empty", []Span{{0, 0}}},
		{"size that rounds past 2^64", []Span{{0, ^uint64(0) - 10}}},
	}
	for _, c := range cases {
		_, err := Restore(1<<20, c.spans)
		assert.ErrorIs(t, err, ErrBadSpan, c.name)
	}
}

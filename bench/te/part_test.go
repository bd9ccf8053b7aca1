package te

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPart(t *testing.T) {
	for _, tc := range []struct {
		name            string
		n, chunk, i, of int
		off, span       int
	}{
		{"even split", 8 << 20, 1 << 20, 1, 2, 4 << 20, 4 << 20},
		{"remainder unused", 10, 3, 2, 3, 6, 3},
		{"fewer chunks than sharers overlap", 2, 1, 3, 4, 1, 1},
		{"one chunk for all", 1, 1, 5, 8, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			off, span := part(tc.n, tc.chunk, tc.i, tc.of)
			assert.Equal(t, tc.off, off)
			assert.Equal(t, tc.span, span)
			assert.LessOrEqual(t, off+span, tc.n)
		})
	}
}

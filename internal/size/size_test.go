package size_test

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/size"
)

// sizeCase is one row of testdata/cases.json, the table that the Python
// package's parser is held to as well (python/tests/test_size.py).
type sizeCase struct {
	In    string `json:"in"`
	Bytes int64  `json:"bytes"`
	Error bool   `json:"error"`
	Why   string `json:"why"`
}

func loadCases(t *testing.T) []sizeCase {
	t.Helper()
	raw, err := os.ReadFile("testdata/cases.json")
	require.NoError(t, err)
	var table struct {
		Cases []sizeCase `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(raw, &table))
	require.NotEmpty(t, table.Cases)
	return table.Cases
}

func TestParse(t *testing.T) {
	for _, tc := range loadCases(t) {
		got, err := size.Parse(tc.In)
		if tc.Error {
			assert.ErrorIs(t, err, size.ErrSyntax, "%q (%s): got %d", tc.In, tc.Why, got)
			continue
		}
		if assert.NoError(t, err, "%q (%s)", tc.In, tc.Why) {
			assert.Equal(t, tc.Bytes, got, "%q (%s)", tc.In, tc.Why)
		}
	}
}

func TestErrorNamesInput(t *testing.T) {
	_, err := size.Parse("3 parsecs")
	assert.ErrorIs(t, err, size.ErrSyntax)
	assert.ErrorContains(t, err, `"3 parsecs"`)
}

func TestFormatRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 1000, 4096, 128 << 10, 3 << 20, 1 << 30, 1e9, 5 << 40, math.MaxInt64} {
		got, err := size.Parse(size.Format(n))
		require.NoError(t, err, size.Format(n))
		assert.Equal(t, n, got, size.Format(n))
	}
	assert.Equal(t, "128KiB", size.Format(128<<10))
	assert.Equal(t, "1000000", size.Format(1000000))
	assert.Equal(t, "16GiB", size.Size(16<<30).String())
}

func TestSizeFlag(t *testing.T) {
	var s size.Size
	require.NoError(t, s.Set("16GB"))
	assert.Equal(t, size.Size(16<<30), s)
	err := s.Set("16 furlongs")
	assert.True(t, errors.Is(err, size.ErrSyntax), "%v", err)
	assert.Equal(t, size.Size(16<<30), s, "a bad value leaves the flag as it was")
	assert.Equal(t, "size", s.Type())
}

package trace_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/bench/trace"
)

// The reader is internal/trace's, tested there; these are its re-exports.
func TestReexports(t *testing.T) {
	reqs, err := trace.Load("")
	require.NoError(t, err)
	assert.Equal(t, trace.Conversation(), reqs)
	assert.Len(t, reqs, trace.ConversationLines)
	_, err = trace.ReadTrace(strings.NewReader("{}"))
	require.ErrorIs(t, err, trace.ErrSyntax)
}

func TestRealBlockBytes(t *testing.T) {
	// LLaMA3-70B, fp16: 80 layers, 8 KV heads of 128 dims, K and V.
	perToken := 80 * 8 * 128 * 2 * 2
	assert.Equal(t, 327680, perToken)
	assert.Equal(t, 160<<20, trace.RealBlockBytes)
	assert.Equal(t, 2560*trace.DefaultBlockBytes, trace.RealBlockBytes)
}

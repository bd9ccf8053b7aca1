package router

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
)

// A request's cache_salt and the LoRA adapter its model names go into its
// blocks as vLLM hashes them (blockhash's vectors check those ids against
// vLLM's), in routing and in the index query alike; the same tokens
// without them, or with another salt, are other blocks.
func TestRequestExtrasNameBlocks(t *testing.T) {
	_, es := cluster(t, 1, 1)
	const bs = 16
	h := newHarness(t, nil, func(c *Config) {
		c.BlockHash, c.BlockSize = "vllm:sha256", bs
		c.LoRAModules = map[string]string{"sql": "/adapters/sql"}
	}, es...)
	scheme, err := blockhash.Parse("vllm:sha256", bs, "")
	require.NoError(t, err)
	prompt := ids(3*bs + 5)
	want := func(x blockhash.Extra) []uint64 { return blockhash.BlocksFor(scheme, nil, prompt, x) }
	plain := want(blockhash.Extra{})
	salted := want(blockhash.Extra{CacheSalt: "tenant-a"})
	lora := want(blockhash.Extra{LoRAName: "sql", LoRAPath: "/adapters/sql", CacheSalt: "tenant-a"})
	require.Len(t, plain, 3)
	require.NotEqual(t, plain[0], salted[0])
	require.NotEqual(t, salted[1], lora[1], "the adapter is in every block")

	cases := []struct {
		name string
		body map[string]any
		want []uint64
	}{
		{"no extras", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 1}, plain},
		{"null salt is none", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 1, "cache_salt": nil}, plain},
		{"cache_salt", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a"}, salted},
		{"adapter and salt", map[string]any{"model": "sql", "prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a"}, lora},
		{"unknown adapter is the base model", map[string]any{"model": "other", "prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a"}, salted},
	}
	for _, tc := range cases {
		before := h.rr.count()
		a := h.do("POST", "/v1/completions", tc.body)
		require.Equal(t, 200, a.status, "%s: %s", tc.name, a.body)
		h.rr.mu.Lock()
		got := h.rr.scheduled[before].Blocks
		h.rr.mu.Unlock()
		assert.Equal(t, tc.want, got, tc.name)
	}
	h.rr.waitIdle(t)

	// The index query names the same blocks.
	before := len(h.rr.queries())
	a := h.do("POST", "/v1/index/query", map[string]any{"tokens": prompt, "cache_salt": "tenant-a", "model": "sql"})
	require.Equal(t, 200, a.status, "%s", a.body)
	assert.Equal(t, lora, h.rr.queries()[before])

	// A salt vLLM refuses is refused here, before anything is scheduled.
	for _, salt := range []any{"", 7, []string{"x"}} {
		before := h.rr.count()
		a := h.do("POST", "/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "cache_salt": salt})
		require.Equal(t, 400, a.status, "cache_salt %v: %s", salt, a.body)
		assert.Contains(t, a.apiErr(t).Message, "cache_salt")
		assert.Equal(t, before, h.rr.count())
	}
}

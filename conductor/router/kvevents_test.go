package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/indexer"
	"github.com/mooncake-go/mooncake/conductor/kvevents/kvtest"
)

// The prefix index follows the engines' own KV events: a prompt goes to
// the prefill instance whose cache holds its prefix, as the engine
// reported it, and stops going there once the engine is gone.
func TestRoutesOnEnginesKVEvents(t *testing.T) {
	sched, err := conductor.New(conductor.Config{Policy: conductor.LocalCacheAware, Admission: conductor.RejectNone, BlockTokens: 16})
	require.NoError(t, err)
	x := indexer.New(indexer.Config{Mirror: sched, DownAfter: 300 * time.Millisecond})
	t.Cleanup(x.Close)
	_, es := cluster(t, 2, 1)
	pubs := []*kvtest.Publisher{kvtest.New(t, "127.0.0.1:0", true), kvtest.New(t, "127.0.0.1:0", true)}
	h := newHarness(t, sched, func(c *Config) {
		c.BlockHash, c.BlockSize, c.Indexer, c.Model = "vllm:sha256", 16, x, "tiny"
		for i := range pubs {
			c.Instances[i].KVEvents, c.Instances[i].KVReplay = pubs[i].Endpoint, pubs[i].Replay
		}
	}, es...)
	for _, p := range pubs {
		p.WaitSubscribed()
	}

	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 7 + i
	}
	scheme, err := blockhash.Parse("vllm:sha256", 16, "")
	require.NoError(t, err)
	blocks := scheme.Blocks(nil, prompt)
	require.Len(t, blocks, 2)

	route := func() string {
		a := h.do("POST", "/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 2})
		require.Equal(t, 200, a.status, string(a.body))
		return a.header.Get("X-Conductor-Prefill")
	}
	// p1 reports the prompt's blocks, as vLLM would after serving it.
	pubs[1].Publish(kvtest.Batch(0, kvtest.Stored("GPU", blocks...)), true)
	require.Eventually(t, func() bool { return sched.Longest(blocks)["p1"] == 2 }, 5*time.Second, 10*time.Millisecond)
	for range 3 {
		assert.Equal(t, "p1", route())
	}
	// The indexer's API sees the same, in official Mooncake's shape.
	a := h.do("POST", "/query", map[string]any{"model": "tiny", "block_size": 16, "token_ids": prompt})
	require.Equal(t, 200, a.status, string(a.body))
	var q map[string]map[string]map[string]any
	require.NoError(t, json.Unmarshal(a.body, &q))
	assert.EqualValues(t, 32, q["default"]["p1"]["longest_matched"])
	assert.EqualValues(t, 0, q["default"]["p0"]["longest_matched"])

	// p1 evicts the last block: only the first is left.
	pubs[1].Publish(kvtest.Batch(0, kvtest.Removed("GPU", blocks[1])), true)
	require.Eventually(t, func() bool { return sched.Longest(blocks)["p1"] == 1 }, 5*time.Second, 10*time.Millisecond)
	// p1 dies: its blocks leave the index within DownAfter.
	pubs[1].Close()
	require.Eventually(t, func() bool { return sched.Longest(blocks)["p1"] == 0 }, 5*time.Second, 10*time.Millisecond)

	// Unregistering an instance stops following it.
	require.NoError(t, h.router.Remove("p0"))
	assert.Len(t, x.Registrations(), 1)
}

func TestKVEventsNeedAnIndexerAndEngineHashes(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	in := Instance{ID: "p0", Role: RolePrefill, URL: "http://127.0.0.1:1", KVEvents: p.Endpoint}
	sched, err := conductor.New(conductor.Config{})
	require.NoError(t, err)
	_, err = New(Config{Scheduler: sched, Instances: []Instance{in}})
	assert.ErrorIs(t, err, ErrInvalidInstance)
	assert.ErrorContains(t, err, "no Indexer")

	x := indexer.New(indexer.Config{})
	defer x.Close()
	_, err = New(Config{Scheduler: sched, Instances: []Instance{in}, Indexer: x})
	assert.ErrorIs(t, err, ErrInvalidInstance)
	assert.ErrorContains(t, err, "block hashing")
	_, err = New(Config{Scheduler: sched, BlockHash: "vllm:sha256"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "block size")
	_, err = New(Config{Scheduler: sched, BlockHash: "md5", BlockSize: 16})
	assert.ErrorIs(t, err, blockhash.ErrUnknownScheme)
	_, err = ParseInstance(RolePrefill, "p0=http://h:1,kv_replay=tcp://h:2")
	assert.ErrorIs(t, err, ErrInvalidInstance)
	assert.ErrorContains(t, err, "kv_replay without kv_events")
	got, err := ParseInstance(RolePrefill, "p0=http://h:1,kv_events=tcp://h:5557,kv_replay=tcp://h:5558")
	require.NoError(t, err)
	assert.Equal(t, "tcp://h:5557", got.KVEvents)
	assert.Equal(t, "tcp://h:5558", got.KVReplay)
	// A failed subscription leaves the scheduler as it was.
	bad := in
	bad.KVEvents = "tcp://h"
	r, err := New(Config{Scheduler: sched, Indexer: x, BlockHash: "vllm", BlockSize: 16})
	require.NoError(t, err)
	defer r.Close()
	assert.ErrorIs(t, r.Register(bad), ErrInvalidInstance)
	require.NoError(t, r.Register(in))
}

// A prompt whose prefix a busy instance holds goes to an idle one; under
// the global policy that one pulls the prefix from the store (Algorithm 1:
// the pull beats both the queue and a recompute), under the local policy
// it recomputes it. The store's blocks come from a master's KV events.
func TestGlobalPolicyPullsFromTheStoreInsteadOfQueueing(t *testing.T) {
	for _, tc := range []struct {
		policy conductor.Policy
		reused int // blocks
	}{{conductor.GlobalCacheAware, 128}, {conductor.LocalCacheAware, 0}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			sched, err := conductor.New(conductor.Config{Policy: tc.policy, Admission: conductor.RejectNone, BlockTokens: 16})
			require.NoError(t, err)
			x := indexer.New(indexer.Config{Mirror: sched})
			t.Cleanup(x.Close)
			_, es := cluster(t, 2, 1)
			engineEvents, storeEvents := kvtest.New(t, "127.0.0.1:0", false), kvtest.New(t, "127.0.0.1:0", false)
			h := newHarness(t, sched, func(c *Config) {
				c.BlockHash, c.BlockSize, c.Indexer, c.Model = "vllm", 16, x, "tiny"
				c.PrefillTimeout = 2 * time.Second
				c.Instances[0].KVEvents = engineEvents.Endpoint
			}, es...)
			require.NoError(t, x.Register(indexer.Registration{Endpoint: storeEvents.Endpoint, Type: indexer.TypeMooncake,
				Model: "tiny", Instance: conductor.StoreHolder, BlockSize: 16}))
			engineEvents.WaitSubscribed()
			storeEvents.WaitSubscribed()

			scheme, err := blockhash.Parse("vllm", 16, "")
			require.NoError(t, err)
			prompt := make([]int, 2048)
			for i := range prompt {
				prompt[i] = 11 + i%1000
			}
			blocks := scheme.Blocks(nil, prompt)
			engineEvents.Publish(kvtest.Batch(0, kvtest.Stored("GPU", blocks...)), true)
			storeEvents.Publish(kvtest.Batch(0, map[string]any{"event_type": "stored", "seq_hashes": blocks, "medium": "cpu"}), true)
			require.Eventually(t, func() bool {
				l := sched.Longest(blocks)
				return l["p0"] == len(blocks) && l[conductor.StoreHolder] == len(blocks)
			}, 5*time.Second, 10*time.Millisecond)

			// p0 gets a long prompt that hangs in its prefill: its queue is busy.
			es[0].setFault(faultHang)
			other := make([]int, 4000)
			for i := range other {
				other[i] = 1500 + i%500
			}
			done := make(chan answer, 1)
			go func() {
				done <- h.do("POST", "/v1/completions", map[string]any{"model": "tiny", "prompt": other, "max_tokens": 2})
			}()
			require.Eventually(t, func() bool { return es[0].calls.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

			a := h.do("POST", "/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 2})
			require.Equal(t, http.StatusOK, a.status, string(a.body))
			assert.Equal(t, "p1", a.header.Get("X-Conductor-Prefill"))
			m := h.do("GET", "/metrics", nil)
			assert.Contains(t, string(m.body), fmt.Sprintf("mooncake_conductor_reused_blocks_total %d\n", tc.reused))
			es[0].setFault(faultNone)
			assert.Equal(t, http.StatusGatewayTimeout, (<-done).status)
		})
	}
}

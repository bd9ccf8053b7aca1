package indexer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/kvevents"
	"github.com/mooncake-go/mooncake/conductor/kvevents/kvtest"
)

// Nothing of ours may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, kvtest.IgnoreLeaks())
}

// mirror records what an Indexer mirrors, per instance.
type mirror struct {
	mu   sync.Mutex
	held map[string]map[uint64]bool
	log  []string
}

func newMirror() *mirror { return &mirror{held: map[string]map[uint64]bool{}} }

func (m *mirror) BlockStored(inst string, blocks []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[inst] == nil {
		m.held[inst] = map[uint64]bool{}
	}
	for _, b := range blocks {
		if m.held[inst][b] {
			m.log = append(m.log, "double store")
		}
		m.held[inst][b] = true
	}
}

func (m *mirror) BlockRemoved(inst string, blocks []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range blocks {
		if !m.held[inst][b] {
			m.log = append(m.log, "removal of a block not stored")
		}
		delete(m.held[inst], b)
	}
}

func (m *mirror) StoreAdded(blocks []uint64)   { m.BlockStored("store", blocks) }
func (m *mirror) StoreEvicted(blocks []uint64) { m.BlockRemoved("store", blocks) }

func (m *mirror) blocks(inst string) []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []uint64
	for b := range m.held[inst] {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// server is an Indexer behind its HTTP API.
type server struct {
	t  *testing.T
	x  *Indexer
	hs *httptest.Server
}

func newServer(t *testing.T, cfg Config) *server {
	x := New(cfg)
	mux := http.NewServeMux()
	x.Routes(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { hs.Close(); x.Close() })
	return &server{t: t, x: x, hs: hs}
}

// post sends v as JSON and decodes the answer into out (if not nil); it
// returns the status.
func (s *server) post(path string, v any, out any) int {
	s.t.Helper()
	b, err := json.Marshal(v)
	require.NoError(s.t, err)
	resp, err := http.Post(s.hs.URL+path, "application/json", bytes.NewReader(b))
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	if out != nil {
		require.NoError(s.t, json.Unmarshal(body, out), string(body))
	}
	return resp.StatusCode
}

type queryAnswer map[string]map[string]struct {
	Longest int            `json:"longest_matched"`
	GPU     int            `json:"GPU"`
	CPU     int            `json:"CPU"`
	DISK    int            `json:"DISK"`
	DP      map[string]int `json:"DP"`
}

// waitHits polls /query_by_hash until inst's longest match is want tokens.
func (s *server) waitHits(q map[string]any, inst string, want int) queryAnswer {
	s.t.Helper()
	var a queryAnswer
	if !assert.Eventually(s.t, func() bool {
		a = queryAnswer{}
		require.Equal(s.t, 200, s.post("/query_by_hash", q, &a))
		return a["default"][inst].Longest == want
	}, 10*time.Second, 10*time.Millisecond) {
		s.t.Fatalf("%s: longest %d, want %d; last answer %+v; publishers %+v", inst, a["default"][inst].Longest, want, a, s.x.Stats())
	}
	return a
}

func reg(p *kvtest.Publisher, typ, inst string, rank int) map[string]any {
	return map[string]any{"endpoint": p.Endpoint, "replay_endpoint": p.Replay, "type": typ, "modelname": "m",
		"lora_name": "", "tenant_id": "default", "instance_id": inst, "block_size": 16, "dp_rank": rank}
}

func TestIndexerTiersRanksAndMirror(t *testing.T) {
	m := newMirror()
	s := newServer(t, Config{Mirror: m})
	r0, r1 := kvtest.New(t, "127.0.0.1:0", true), kvtest.New(t, "127.0.0.1:0", true)
	pool := kvtest.New(t, "127.0.0.1:0", false)
	other := kvtest.New(t, "127.0.0.1:0", false)

	var ok map[string]any
	require.Equal(t, 200, s.post("/register", reg(r0, "vLLM", "engine-a", 0), &ok))
	assert.Equal(t, map[string]any{"status": "registered successfully", "instance_id": "engine-a"}, ok)
	require.Equal(t, 200, s.post("/register", reg(r1, "vllm", "engine-a", 1), nil))
	require.Equal(t, 200, s.post("/register", reg(pool, "Mooncake", "shared-pool", 0), nil))
	require.Equal(t, 200, s.post("/register", reg(other, "vLLM", "engine-b", 0), nil))
	for _, p := range []*kvtest.Publisher{r0, r1, pool, other} {
		p.WaitSubscribed()
	}

	// Rank 0 holds blocks 1, 2 on GPU; rank 1 holds 1, 2, 3 (3 on CPU);
	// the pool holds 4; engine-b holds 1.
	r0.Publish(kvtest.Batch(0, kvtest.Stored("GPU", 1, 2)), true)
	r1.Publish(kvtest.Batch(1, kvtest.Stored("GPU", 1, 2), kvtest.Stored("CPU", 3)), true)
	pool.Publish(kvtest.Batch(0, map[string]any{"event_type": "stored", "seq_hashes": []uint64{4}, "medium": "cpu", "object_key": "4"}), true)
	other.Publish(kvtest.Batch(0, kvtest.Stored("", 1)), true)

	// Every publisher's batch is in before the answer is checked (engine-a
	// reaches 4 blocks with rank 1 and the pool alone).
	require.Eventually(t, func() bool {
		for _, st := range s.x.Stats() {
			if st.Events.Batches == 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond)
	q := map[string]any{"model": "m", "block_size": 16, "seq_hashes": []uint64{1, 2, 3, 4, 5}}
	a := s.waitHits(q, "engine-a", 4*16)
	ea := a["default"]["engine-a"]
	assert.Equal(t, 2*16, ea.GPU)
	assert.Equal(t, 0, ea.CPU, "the CPU run breaks at block 1, held on GPU only")
	assert.Equal(t, 0, ea.DISK)
	assert.Equal(t, map[string]int{"0": 2 * 16, "1": 3 * 16}, ea.DP)
	s.waitHits(q, "engine-b", 16)
	assert.NotContains(t, a["default"], "shared-pool", "a pool is not an engine")

	// One instance only, and the old name of the hashes.
	var one queryAnswer
	require.Equal(t, 200, s.post("/query_by_hash", map[string]any{"model": "m", "block_size": 16, "block_hash": []uint64{1}, "instance_id": "engine-b"}, &one))
	assert.Equal(t, []string{"engine-b"}, keys(one["default"]))
	// Another scope sees nothing.
	var none queryAnswer
	require.Equal(t, 200, s.post("/query_by_hash", map[string]any{"model": "m", "block_size": 32, "seq_hashes": []uint64{1}}, &none))
	assert.Empty(t, none["default"])

	require.Eventually(t, func() bool { return slices.Equal(m.blocks("engine-a"), []uint64{1, 2}) }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []uint64{1}, m.blocks("engine-b"))
	assert.Empty(t, m.blocks("shared-pool"), "a pool is not an instance")
	require.Eventually(t, func() bool { return slices.Equal(m.blocks("store"), []uint64{4}) }, 5*time.Second, 10*time.Millisecond)
	// The pool moves block 4 to disk (removed cpu, stored disk): still in
	// the store; then drops it.
	pool.Publish(kvtest.Batch(0, map[string]any{"event_type": "stored", "seq_hashes": []uint64{4}, "medium": "disk"},
		map[string]any{"event_type": "removed", "seq_hashes": []uint64{4}, "medium": "cpu"}), true)
	a = s.waitHits(q, "engine-a", 4*16)
	assert.Equal(t, 0, a["default"]["engine-a"].CPU)
	assert.Equal(t, []uint64{4}, m.blocks("store"))
	pool.Publish(kvtest.Batch(0, map[string]any{"event_type": "removed", "seq_hashes": []uint64{4}, "medium": "disk"}), true)
	require.Eventually(t, func() bool { return len(m.blocks("store")) == 0 }, 5*time.Second, 10*time.Millisecond)
	s.waitHits(q, "engine-a", 3*16)
	pool.Publish(kvtest.Batch(0, map[string]any{"event_type": "stored", "seq_hashes": []uint64{4}, "medium": "cpu"}), true)
	s.waitHits(q, "engine-a", 4*16)

	// Rank 0 drops block 2: rank 1 still has it, so the instance does.
	r0.Publish(kvtest.Batch(0, kvtest.Removed("GPU", 2)), true)
	a = s.waitHits(q, "engine-a", 4*16)
	require.Eventually(t, func() bool {
		a = queryAnswer{}
		s.post("/query_by_hash", q, &a)
		return a["default"]["engine-a"].DP["0"] == 16
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []uint64{1, 2}, m.blocks("engine-a"))
	// Rank 1 clears its cache: block 2 is gone from the instance, block 1
	// is still on rank 0.
	r1.Publish(kvtest.Batch(1, kvtest.Cleared()), true)
	s.waitHits(q, "engine-a", 16)
	require.Eventually(t, func() bool { return slices.Equal(m.blocks("engine-a"), []uint64{1}) }, 5*time.Second, 10*time.Millisecond)

	// Unregister rank 0: engine-a has nothing left.
	var un map[string]any
	require.Equal(t, 200, s.post("/unregister", map[string]any{"instance_id": "engine-a", "dp_rank": 0}, &un))
	assert.Equal(t, map[string]any{"status": "unregistered successfully", "removed_instances": []any{"engine-a|default|0"}}, un)
	assert.Empty(t, m.blocks("engine-a"))
	m.mu.Lock()
	assert.Empty(t, m.log)
	m.mu.Unlock()
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestIndexerQueryByTokens(t *testing.T) {
	s := newServer(t, Config{})
	p := kvtest.New(t, "127.0.0.1:0", false)
	r := reg(p, "vLLM", "e", 0)
	r["hash_profile"] = map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}
	require.Equal(t, 200, s.post("/register", r, nil))
	p.WaitSubscribed()
	scheme, err := blockhash.Parse("vllm:sha256_cbor", 16, "0")
	require.NoError(t, err)
	tokens := make([]int, 50) // 3 full blocks and a partial one
	for i := range tokens {
		tokens[i] = 1000 + i
	}
	hs := scheme.Blocks(nil, tokens)
	require.Len(t, hs, 3)
	p.Publish(kvtest.Batch(0, kvtest.Stored("GPU", hs[:2]...)), true)

	q := map[string]any{"model": "m", "block_size": 16, "token_ids": tokens}
	require.Eventually(t, func() bool {
		var a queryAnswer
		s.post("/query", q, &a)
		return a["default"]["e"].Longest == 32
	}, 5*time.Second, 10*time.Millisecond)

	// The same query in msgpack, token_ids as a bin of int32s.
	bin := make([]byte, 4*len(tokens))
	for i, tk := range tokens {
		binary.LittleEndian.PutUint32(bin[4*i:], uint32(tk))
	}
	body, err := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "token_ids": bin})
	require.NoError(t, err)
	resp, err := http.Post(s.hs.URL+"/query", "application/msgpack", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "application/msgpack", resp.Header.Get("Content-Type"))
	var a map[string]map[string]map[string]any
	require.NoError(t, msgpack.NewDecoder(resp.Body).Decode(&a))
	assert.EqualValues(t, 32, a["default"]["e"]["longest_matched"])
	assert.EqualValues(t, 32, a["default"]["e"]["GPU"])
}

func TestIndexerDropsDeadPublisher(t *testing.T) {
	m := newMirror()
	s := newServer(t, Config{Mirror: m, DownAfter: 300 * time.Millisecond})
	p := kvtest.New(t, "127.0.0.1:0", false)
	require.Equal(t, 200, s.post("/register", reg(p, "vLLM", "e", 0), nil))
	p.WaitSubscribed()
	p.Publish(kvtest.Batch(0, kvtest.Stored("GPU", 7, 8)), true)
	q := map[string]any{"model": "m", "block_size": 16, "seq_hashes": []uint64{7, 8}}
	s.waitHits(q, "e", 32)
	p.Close() // as a killed engine: its connection drops, redials are refused
	s.waitHits(q, "e", 0)
	assert.Empty(t, m.blocks("e"))
	st := s.x.Stats()
	require.Len(t, st, 1)
	assert.Equal(t, uint64(1), st[0].Events.Resets)
}

func TestIndexerRejectsBadRequests(t *testing.T) {
	s := newServer(t, Config{})
	p := kvtest.New(t, "127.0.0.1:0", false)
	good := reg(p, "vLLM", "e", 0)
	bad := func(k string, v any) map[string]any {
		r := map[string]any{}
		for kk, vv := range good {
			r[kk] = vv
		}
		r[k] = v
		return r
	}
	for name, body := range map[string]map[string]any{
		"type":        bad("type", "TensorRT"),
		"endpoint":    bad("endpoint", "ipc:///x"),
		"no endpoint": bad("endpoint", ""),
		"instance":    bad("instance_id", ""),
		"pipe":        bad("instance_id", "a|b"),
		"block size":  bad("block_size", 0),
		"rank":        bad("dp_rank", -1),
		"group":       bad("cache_group", 1),
		"profile":     bad("hash_profile", map[string]any{"strategy": "md5"}),
		"projection":  bad("hash_profile", map[string]any{"strategy": "vllm_v1", "index_projection": "low64_le"}),
		"xxh no seed": bad("hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "xxhash"}),
	} {
		var e map[string]string
		assert.Equal(t, 400, s.post("/register", body, &e), name)
		assert.NotEmpty(t, e["error"], name)
	}
	require.Equal(t, 200, s.post("/register", good, nil))
	assert.Equal(t, 200, s.post("/register", good, nil), "the same registration again")
	assert.Equal(t, 409, s.post("/register", bad("endpoint", "tcp://127.0.0.1:1"), nil), "same key, other endpoint")
	assert.Equal(t, 409, s.post("/register", bad("instance_id", "f"), nil), "same endpoint, other key")
	assert.Equal(t, 404, s.post("/unregister", map[string]any{"instance_id": "nope"}, nil))
	assert.Equal(t, 400, s.post("/unregister", map[string]any{}, nil))
	assert.Equal(t, 400, s.post("/query", map[string]any{"model": "m", "token_ids": []int{1}}, nil), "no block_size")
	assert.Equal(t, 400, s.post("/query", map[string]any{"block_size": 16, "token_ids": []int{1}}, nil), "no model")
	assert.Equal(t, 400, s.post("/query", map[string]any{"model": "m", "block_size": 16}, nil), "neither tokens nor hashes")
	assert.Equal(t, 400, s.post("/query", map[string]any{"model": "m", "block_size": 16, "token_ids": []int{-1}}, nil))

	resp, err := http.Post(s.hs.URL+"/register", "application/json", bytes.NewReader([]byte("{")))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)
	resp, err = http.Get(s.hs.URL + "/query")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 405, resp.StatusCode)
	resp, err = http.Post(s.hs.URL+"/query", "application/msgpack", bytes.NewReader([]byte{0xc1}))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)

	var svc struct {
		Count    int           `json:"count"`
		Services []SourceStats `json:"services"`
	}
	resp, err = http.Get(s.hs.URL + "/services")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&svc))
	resp.Body.Close()
	assert.Equal(t, 1, svc.Count)
	assert.Equal(t, "e|default|0", svc.Services[0].Key)
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	c, err := LoadConfig(filepath.Join(dir, "missing.json"))
	require.NoError(t, err)
	assert.Equal(t, DefaultHTTPPort, c.HTTPPort)

	p := kvtest.New(t, "127.0.0.1:0", false)
	path := filepath.Join(dir, "conductor_config.json")
	body, _ := json.Marshal(map[string]any{"http_server_port": 14444, "kvevent_instance": map[string]any{
		"vllm-a-0": reg(p, "vLLM", "a", 0)}})
	require.NoError(t, os.WriteFile(path, body, 0o600))
	c, err = LoadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, 14444, c.HTTPPort)
	x := New(Config{})
	defer x.Close()
	require.NoError(t, x.RegisterAll(c))
	assert.Len(t, x.Registrations(), 1)

	require.NoError(t, os.WriteFile(path, []byte(`{"http_server_port": 70000}`), 0o600))
	_, err = LoadConfig(path)
	assert.ErrorIs(t, err, ErrInvalid)
	require.NoError(t, os.WriteFile(path, []byte(`{"kvevent_instance": {"x": {"type": "nope"}}}`), 0o600))
	c, err = LoadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, DefaultHTTPPort, c.HTTPPort)
	err = x.RegisterAll(c)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `"x"`)

	t.Setenv(ConfigEnv, path)
	assert.Equal(t, path, DefaultConfigPath())
}

func TestCollector(t *testing.T) {
	s := newServer(t, Config{})
	p := kvtest.New(t, "127.0.0.1:0", false)
	require.Equal(t, 200, s.post("/register", reg(p, "vLLM", "e", 2), nil))
	p.WaitSubscribed()
	p.Publish(kvtest.Batch(2, kvtest.Stored("GPU", 1, 2, 3)), true)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.x.Collector())
	series := func() map[string]*dto.Metric {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]*dto.Metric{}
		for _, mf := range mfs {
			require.Len(t, mf.GetMetric(), 1, mf.GetName())
			out[mf.GetName()] = mf.GetMetric()[0]
		}
		return out
	}
	require.Eventually(t, func() bool {
		return series()["mooncake_conductor_kv_events_blocks"].GetGauge().GetValue() == 3
	}, 5*time.Second, 10*time.Millisecond)
	got := series()
	assert.Len(t, got, 8)
	assert.Equal(t, 1.0, got["mooncake_conductor_kv_events_connected"].GetGauge().GetValue())
	assert.Equal(t, 1.0, got["mooncake_conductor_kv_events_batches_total"].GetCounter().GetValue())
	for _, l := range got["mooncake_conductor_kv_events_blocks"].GetLabel() {
		if l.GetName() == "dp_rank" {
			assert.Equal(t, "2", l.GetValue())
		}
	}
}

// Two ranks of one instance storing and dropping the same blocks at once,
// from their own goroutines as their subscribers do: the mirror ends where
// the index does (an instance holds a block while any rank does).
func TestMirrorFollowsConcurrentRanksInOrder(t *testing.T) {
	m := newMirror()
	x := New(Config{Mirror: m})
	defer x.Close()
	var hs [2]*handler
	for r := range hs {
		reg := Registration{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 1+r), Type: "vLLM", Model: "m",
			Instance: "e", BlockSize: 16, DPRank: r}
		require.NoError(t, reg.normalize())
		s := &source{reg: reg, held: map[uint64]media{}, blocks: &blocks{by: map[uint64][]*source{}}}
		if r == 1 {
			s.blocks = hs[0].s.blocks
		}
		hs[r] = &handler{x: x, s: s}
	}
	const blocksN, rounds = 4, 2000
	var wg sync.WaitGroup
	for r := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for range rounds {
				k := uint64(rng.IntN(blocksN))
				kind := kvevents.Stored
				if rng.IntN(2) == 0 {
					kind = kvevents.Removed
				}
				hs[r].Apply(&kvevents.Batch{Events: []kvevents.Event{{Kind: kind, Hashes: []uint64{k}, Medium: kvevents.GPU}}})
			}
		}()
	}
	wg.Wait()
	var want []uint64
	for k := range uint64(blocksN) {
		if hs[0].s.held[k] != 0 || hs[1].s.held[k] != 0 {
			want = append(want, k)
		}
	}
	assert.Equal(t, want, m.blocks("e"))
	m.mu.Lock()
	assert.Empty(t, m.log)
	m.mu.Unlock()
}

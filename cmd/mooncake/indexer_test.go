package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/kvevents/kvtest"
	"github.com/mooncake-go/mooncake/conductor/router"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func postJSON(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// longest is longest_matched of instance in a /query answer.
func longest(ans map[string]any, instance string) float64 {
	tenant, _ := ans["default"].(map[string]any)
	in, _ := tenant[instance].(map[string]any)
	n, _ := in["longest_matched"].(float64)
	return n
}

// `mooncake indexer` is official Mooncake's Conductor indexer: its config
// file registers publishers, their events answer /query_by_hash, and
// /register, /services and /metrics work.
func TestIndexerCommand(t *testing.T) {
	p, q := kvtest.New(t, "127.0.0.1:0", true), kvtest.New(t, "127.0.0.1:0", false)
	cfg := filepath.Join(t.TempDir(), "conductor_config.json")
	body := fmt.Sprintf(`{"http_server_port": 13333, "kvevent_instance": {"engine-a-0": {
		"endpoint": %q, "replay_endpoint": %q, "type": "vLLM", "modelname": "m", "lora_name": "",
		"tenant_id": "default", "instance_id": "engine-a", "block_size": 16, "dp_rank": 0}}}`, p.Endpoint, p.Replay)
	require.NoError(t, os.WriteFile(cfg, []byte(body), 0o644))
	cmd := selfCommand(t, "indexer", "--listen", "127.0.0.1:0", "--down-after", "500ms")
	cmd.Env = append(cmd.Env, "CONDUCTOR_CONFIG_PATH="+cfg)
	line := startProc(t, cmd, "indexer listening ")
	require.Contains(t, line, "publishers=1")
	base := strings.Fields(strings.TrimPrefix(line, "indexer listening "))[0]

	p.WaitSubscribed()
	p.Publish(kvtest.Batch(0, kvtest.Stored("GPU", 11, 12)), true)
	query := map[string]any{"model": "m", "block_size": 16, "seq_hashes": []uint64{11, 12, 13}}
	require.Eventually(t, func() bool {
		_, ans := postJSON(t, base+"/query_by_hash", query)
		return longest(ans, "engine-a") == 32
	}, 10*time.Second, 20*time.Millisecond)

	status, ans := postJSON(t, base+"/register", map[string]any{"endpoint": q.Endpoint, "type": "vLLM", "modelname": "m",
		"instance_id": "engine-b", "block_size": 16, "dp_rank": 0})
	require.Equal(t, 200, status, ans)
	assert.Equal(t, "registered successfully", ans["status"])
	assert.Contains(t, getBody(t, base+"/services"), `"count":2`)
	assert.Contains(t, getBody(t, base+"/metrics"), `mooncake_conductor_kv_events_blocks{dp_rank="0",instance="engine-a",type="vLLM"} 2`)

	// The engine dies: its blocks leave within --down-after.
	p.Close()
	require.Eventually(t, func() bool {
		_, ans := postJSON(t, base+"/query_by_hash", query)
		return longest(ans, "engine-a") == 0
	}, 10*time.Second, 20*time.Millisecond)
	stopOnSIGTERM(t, cmd, "indexer")
}

// `mooncake conductor` follows an instance's kv_events and serves the
// indexer API beside the router's; prompts are hashed as vLLM does.
func TestConductorFollowsKVEvents(t *testing.T) {
	p0, d0 := standinEngine(t, "prefill"), standinEngine(t, "decode")
	pub := kvtest.New(t, "127.0.0.1:0", true)
	cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0", "--block-hash", "vllm:sha256", "--block-size", "16",
		"--model", "m", "--policy", "local-cache-aware",
		"--prefill", "p0="+p0.URL+",kv_events="+pub.Endpoint+",kv_replay="+pub.Replay, "--decode", "d0="+d0.URL)
	line := startProc(t, cmd, "conductor listening ")
	base := strings.Fields(strings.TrimPrefix(line, "conductor listening "))[0]
	pub.WaitSubscribed()

	tokens := make([]int, 33)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	s, err := blockhash.Parse("vllm:sha256", 16, "")
	require.NoError(t, err)
	blocks := s.Blocks(nil, tokens)
	pub.Publish(kvtest.Batch(0, kvtest.Stored("GPU", blocks...)), true)
	require.Eventually(t, func() bool {
		_, ans := postJSON(t, base+"/query", map[string]any{"model": "m", "block_size": 16, "token_ids": tokens})
		return longest(ans, "p0") == 32
	}, 10*time.Second, 20*time.Millisecond)
	// The scheduler's index has them too.
	_, idx := postJSON(t, base+"/v1/index/query", map[string]any{"tokens": tokens})
	assert.Equal(t, map[string]any{"p0": 2.0}, idx["prefix_blocks"])
	assert.Contains(t, getBody(t, base+"/metrics"), `mooncake_conductor_kv_events_batches_total{dp_rank="0",instance="p0",type="vLLM"} 1`)
	stopOnSIGTERM(t, cmd, "conductor")
}

func TestConductorKVEventsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // named in the message
		is   error  // the cause
	}{
		{[]string{"--block-hash", "vllm"}, "block size", router.ErrInvalidConfig},
		{[]string{"--block-hash", "sha1", "--block-size", "16"}, "unknown scheme", blockhash.ErrUnknownScheme},
		{[]string{"--prefill", "p0=http://127.0.0.1:1,kv_events=tcp://127.0.0.1:2"}, "block hashing", router.ErrInvalidInstance},
	} {
		root := newRoot()
		root.SetArgs(append([]string{"conductor", "--listen", "127.0.0.1:0"}, tc.args...))
		root.SetOut(io.Discard)
		err := root.Execute()
		require.Error(t, err, tc.args)
		assert.Contains(t, err.Error(), tc.want)
		assert.ErrorIs(t, err, tc.is, tc.args)
	}
}

// A master's KV events, as official Mooncake's indexer takes them: the
// store is a shared pool (type Mooncake) whose blocks count, on their
// medium, for every engine of the scope.
func TestIndexerFollowsMasterEvents(t *testing.T) {
	master, addrs, c := startKVMaster(t)
	engine := kvtest.New(t, "127.0.0.1:0", false)
	cfg := filepath.Join(t.TempDir(), "conductor_config.json")
	body := fmt.Sprintf(`{"http_server_port": 13333, "kvevent_instance": {
		"engine": {"endpoint": %q, "type": "vLLM", "modelname": "m", "instance_id": "e", "block_size": 16, "dp_rank": 0},
		"pool": {"endpoint": %q, "replay_endpoint": %q, "type": "Mooncake", "modelname": "m", "instance_id": "pool-a", "block_size": 16, "dp_rank": 0}}}`,
		engine.Endpoint, addrs["kv_events"], addrs["kv_events_replay"])
	require.NoError(t, os.WriteFile(cfg, []byte(body), 0o644))
	idx := selfCommand(t, "indexer", "--config", cfg, "--listen", "127.0.0.1:0")
	base := strings.Fields(strings.TrimPrefix(startProc(t, idx, "indexer listening "), "indexer listening "))[0]
	engine.WaitSubscribed()
	engine.Publish(kvtest.Batch(0, kvtest.Stored("GPU", 0x10)), true)

	// Blocks 0x10 (on the engine's GPU) and 0x11 (in the store), as a KV
	// connector names them (conductor.BlockKey).
	putKeys(t, c, "m@tp0@0000000000000010", "m@tp0@0000000000000011")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	query := map[string]any{"model": "m", "block_size": 16, "seq_hashes": []uint64{0x10, 0x11, 0x12}}
	var hits map[string]any
	require.Eventually(t, func() bool {
		_, ans := postJSON(t, base+"/query_by_hash", query)
		hits, _ = ans["default"].(map[string]any)["e"].(map[string]any)
		return hits != nil && hits["longest_matched"] == 32.0
	}, 20*time.Second, 20*time.Millisecond)
	assert.Equal(t, 16.0, hits["GPU"], "the engine holds the first block")
	assert.Equal(t, 32.0, hits["CPU"], "the store holds both")
	assert.NotContains(t, hits, "pool-a")
	_, ans := postJSON(t, base+"/query_by_hash", query)
	assert.NotContains(t, ans["default"], "pool-a", "a pool is not an engine")

	rm, err := c.Remove(ctx, &storepb.RemoveRequest{Key: "m@tp0@0000000000000011"})
	require.NoError(t, err)
	require.NoError(t, rm.AsError())
	require.Eventually(t, func() bool {
		_, ans := postJSON(t, base+"/query_by_hash", query)
		h, _ := ans["default"].(map[string]any)["e"].(map[string]any)
		return h != nil && h["longest_matched"] == 16.0 && h["CPU"] == 16.0
	}, 20*time.Second, 20*time.Millisecond)
	stopOnSIGTERM(t, idx, "indexer")
	stopOnSIGTERM(t, master, "master")
}

// startKVMaster runs `mooncake master --enable_kv_events [flags]` with a 1 MiB
// segment mounted; it returns the process, its startup line's addresses
// (rpc, kv_events, kv_events_replay) and a client.
func startKVMaster(t *testing.T, flags ...string) (*exec.Cmd, map[string]string, storepb.MasterClient) {
	t.Helper()
	master := selfCommand(t, append([]string{"master", "--rpc_address", "127.0.0.1", "--rpc_port", "0", "--metrics_port", "-1",
		"--enable_kv_events", "--kv_events_bind_endpoint", "tcp://127.0.0.1:0",
		"--kv_events_replay_endpoint", "tcp://127.0.0.1:0", "--kv_events_backend_id", "pool-a"}, flags...)...)
	line := startProc(t, master, "master listening rpc=")
	addrs := map[string]string{}
	for _, f := range strings.Fields(strings.TrimPrefix(line, "master listening ")) {
		k, v, _ := strings.Cut(f, "=")
		addrs[k] = v
	}
	conn, err := grpc.NewClient(addrs["rpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := storepb.NewMasterClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: "c1", Segment: &storepb.Segment{
		Id: "1", Name: "node-1", Base: 1 << 20, Size: 1 << 20, TransportEndpoint: "127.0.0.1:1", Protocol: "tcp"}})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
	return master, addrs, c
}

// putKeys puts 64-byte objects under keys (metadata only: no bytes move).
func putKeys(t *testing.T, c storepb.MasterClient, keys ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, key := range keys {
		ps, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: key, ValueLength: 64})
		require.NoError(t, err)
		require.NoError(t, ps.Result.AsError())
		res, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: "c1", Key: key})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
}

// `mooncake conductor --store-kv-events` feeds the scheduler's store
// holder from a master's ZMQ events.
func TestConductorFollowsStoreKVEvents(t *testing.T) {
	master, addrs, c := startKVMaster(t)
	p0, d0 := standinEngine(t, "prefill"), standinEngine(t, "decode")
	cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0", "--block-hash", "vllm", "--block-size", "16", "--model", "m",
		"--store-kv-events", addrs["kv_events"], "--store-kv-replay", addrs["kv_events_replay"],
		"--prefill", "p0="+p0.URL, "--decode", "d0="+d0.URL)
	base := strings.Fields(strings.TrimPrefix(startProc(t, cmd, "conductor listening "), "conductor listening "))[0]
	s, err := blockhash.Parse("vllm", 16, "")
	require.NoError(t, err)
	tokens := make([]int, 40)
	blocks := s.Blocks(nil, tokens)
	putKeys(t, c, fmt.Sprintf("m@tp0@%016x", blocks[0]), fmt.Sprintf("m@tp0@%016x", blocks[1]))
	require.Eventually(t, func() bool {
		_, idx := postJSON(t, base+"/v1/index/query", map[string]any{"tokens": tokens})
		pb, _ := idx["prefix_blocks"].(map[string]any)
		return pb["store"] == 2.0
	}, 20*time.Second, 20*time.Millisecond)
	stopOnSIGTERM(t, cmd, "conductor")
	stopOnSIGTERM(t, master, "master")
}

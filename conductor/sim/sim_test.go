package sim_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow/go/v17/arrow"
	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/memory"
	"github.com/apache/arrow/go/v17/parquet/file"
	"github.com/apache/arrow/go/v17/parquet/pqarrow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/sim"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// Hand-computable models: a prefill costs 100 ms plus 1 ms per new token;
// a decode iteration 10 ms plus the larger of 20 ms and 1 ms per request.
var (
	simplePrefill = conductor.PrefillModel{Base: 0.1, Linear: 0.001}
	simpleDecode  = conductor.DecodeModel{Base: 0.01, Weights: 0.02, PerSeq: 0.001}
)

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func req(tsMS int64, in, out int64, hashes ...int64) trace.Request {
	return trace.Request{Timestamp: tsMS, InputLength: in, OutputLength: out, HashIDs: hashes}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   sim.Config
		field string // named in the error; "" for a valid config
	}{
		// The zero value is the paper's deployment.
		{"zero", sim.Config{}, ""},
		// The coupled baseline with chunked prefill.
		{"coupled", sim.Config{Coupled: true, ChunkTokens: 512}, ""},
		{"prefill", sim.Config{Prefill: -1}, "Config.Prefill"},
		{"decode", sim.Config{Decode: -1}, "Config.Decode"},
		{"chunk", sim.Config{ChunkTokens: -1}, "Config.ChunkTokens"},
		{"store", sim.Config{StoreTokens: -1}, "Config.StoreTokens"},
		{"rate", sim.Config{RateScale: -2}, "Config.RateScale"},
		{"output", sim.Config{OutputTokens: -1}, "Config.OutputTokens"},
		{"max requests", sim.Config{MaxRequests: -1}, "Config.MaxRequests"},
		// The scheduler's own fields are checked by conductor.
		{"bandwidth", sim.Config{Bandwidth: -1}, "Config.Bandwidth"},
		{"policy", sim.Config{Policy: 42}, "Config.Policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.field == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, sim.ErrInvalid)
			assert.Contains(t, err.Error(), tc.field, "the error names the field")
		})
	}
	_, err := sim.Run(sim.Config{Prefill: -1}, nil)
	assert.ErrorIs(t, err, sim.ErrInvalid)
}

// One prefill and one decode instance with the simple models: every time
// is arithmetic.
func TestExactTimes(t *testing.T) {
	cfg := sim.Config{Prefill: 1, Decode: 1, PrefillModel: simplePrefill, DecodeModel: simpleDecode,
		Admission: conductor.RejectNone}
	reqs := []trace.Request{
		// 2 blocks, 3 output tokens: prefill 0.1 + 1.024 s.
		req(0, 1024, 3, 1, 2),
		// Arrives at 0.5 s, shares block 1: waits for the first prefill
		// (until 1.124 s), then computes 512 new tokens (0.612 s).
		req(500, 1024, 1, 1, 3),
	}
	res, err := sim.Run(cfg, reqs)
	require.NoError(t, err)
	a, b := res.Outcomes[0], res.Outcomes[1]

	assert.Equal(t, ms(1124), a.TTFT)
	assert.Equal(t, ms(1124), a.PrefillTime)
	assert.Zero(t, a.HitTokens)
	assert.Equal(t, "p0", a.Prefill)
	assert.Equal(t, "d0", a.Decode)
	// The KV cache's last layer reaches decode 1/80 of its transfer after
	// the prefill; then two iterations of 30 ms (batch of one), the first
	// interval the longer (it includes that tail). One tenth of two
	// intervals rounds up to one: TBT is the longest.
	tail := conductor.Config{}.TransferTime(2) / 80
	assert.Equal(t, ms(30)+tail, a.TBT)
	assert.Equal(t, ms(1124)+tail+ms(60), a.Finish)

	assert.Equal(t, 512, b.HitTokens, "block 1 is in the instance's cache")
	assert.Zero(t, b.PulledTokens)
	assert.Equal(t, ms(612), b.PrefillTime)
	assert.Equal(t, ms(1124+612-500), b.TTFT)
	assert.Zero(t, b.TBT, "one output token: no interval")
	assert.Equal(t, ms(1124+612), b.Finish)
}

// The coupled baseline: a prompt's prefill stalls the decodes of its
// instance for its whole duration.
func TestCoupledInterference(t *testing.T) {
	cfg := sim.Config{Coupled: true, Prefill: 1, Decode: 1, LocalTokens: -1, PrefillModel: simplePrefill,
		DecodeModel: simpleDecode}
	reqs := []trace.Request{
		// A on c0: first token at 1.124 s, then decode iterations of 30 ms.
		req(0, 1024, 5, 1, 2),
		// B on c1, the less loaded.
		req(50, 1024, 5, 3, 4),
		// C ties (one request each) and goes to c0, in the middle of A's
		// second iteration (1.154-1.184 s); its prefill (1.124 s) runs next,
		// and A waits for it.
		req(1170, 1024, 2, 5, 6),
	}
	res, err := sim.Run(cfg, reqs)
	require.NoError(t, err)
	a, b, c := res.Outcomes[0], res.Outcomes[1], res.Outcomes[2]
	assert.Equal(t, "c0", a.Prefill)
	assert.Equal(t, "c1", b.Prefill)
	assert.Equal(t, "c0", c.Prefill)
	assert.Equal(t, ms(1124), a.TTFT)
	assert.Equal(t, ms(1124), b.TTFT)
	assert.Equal(t, ms(1184+1124-1170), c.TTFT)
	// A's intervals: 30, 30, 1154 (the stall and a batch of two), 30 ms;
	// the longest tenth of four is one: the stall.
	assert.Equal(t, ms(1154), a.TBT)
	assert.Equal(t, ms(30), b.TBT, "B decodes alone")
	assert.Equal(t, ms(30), c.TBT)

	// Chunked prefill spreads C's prompt over iterations of at most 64
	// tokens next to A's decode: no interval of A is the whole prefill.
	cfg.ChunkTokens = 64
	res, err = sim.Run(cfg, reqs)
	require.NoError(t, err)
	assert.Less(t, res.Outcomes[0].TBT, ms(200))
	assert.Greater(t, res.Outcomes[2].TTFT, ms(1124), "C's prefill is slower in chunks")
}

// Every request is completed or rejected, once, whatever the policy, the
// admission and the load.
func TestConservation(t *testing.T) {
	reqs := trace.Conversation()[:400]
	var cfgs []sim.Config
	for _, p := range conductor.Policies() {
		for _, a := range []conductor.Admission{conductor.RejectPredicted, conductor.RejectCurrentLoad, conductor.RejectNone} {
			cfgs = append(cfgs, sim.Config{Policy: p, Admission: a, Prefill: 2, Decode: 1, RateScale: 8,
				StoreTokens: 2e6})
		}
	}
	cfgs = append(cfgs, sim.Config{Coupled: true, Prefill: 2, Decode: 1, RateScale: 8},
		sim.Config{Coupled: true, ChunkTokens: 512, Prefill: 2, Decode: 1, RateScale: 8})
	rejected := 0
	for _, cfg := range cfgs {
		res, err := sim.Run(cfg, reqs)
		require.NoError(t, err, cfg.Name())
		require.Len(t, res.Outcomes, len(reqs))
		s := res.Summary()
		assert.Equal(t, len(reqs), s.Requests)
		rejected += s.Rejected
		for i, o := range res.Outcomes {
			require.Equal(t, i, o.Index)
			if o.Rejected {
				assert.NotEmpty(t, o.Reason, "%s: request %d", cfg.Name(), i)
				continue
			}
			assert.Positive(t, o.TTFT, "%s: request %d", cfg.Name(), i)
			assert.GreaterOrEqual(t, o.Finish, o.Arrival+o.TTFT, "%s: request %d", cfg.Name(), i)
			assert.LessOrEqual(t, o.HitTokens, o.InputTokens)
			assert.LessOrEqual(t, o.PulledTokens, o.HitTokens)
		}
	}
	assert.Positive(t, rejected, "8x the load on 3 instances must make admission reject")
}

// A run is a function of its Config and the trace; the seed matters to
// the random policy only.
func TestDeterminism(t *testing.T) {
	reqs := trace.Conversation()[:600]
	run := func(cfg sim.Config) []sim.Outcome {
		res, err := sim.Run(cfg, reqs)
		require.NoError(t, err)
		return res.Outcomes
	}
	for _, cfg := range []sim.Config{
		{Policy: conductor.Random, Seed: 7, Prefill: 4, Decode: 2},
		{Policy: conductor.GlobalCacheAware, Prefill: 4, Decode: 2, StoreTokens: 1e6},
		{Coupled: true, Prefill: 2, Decode: 2},
	} {
		assert.Equal(t, run(cfg), run(cfg), cfg.Name())
	}
	a := run(sim.Config{Policy: conductor.Random, Seed: 1, Prefill: 4, Decode: 2})
	b := run(sim.Config{Policy: conductor.Random, Seed: 2, Prefill: 4, Decode: 2})
	assert.NotEqual(t, a, b, "another seed picks other instances")
}

// Fig. 5 on the trace's first 2000 requests, the deployment of the full
// figure: the mean TTFT ordering of the paper.
func TestPolicyOrdering(t *testing.T) {
	rs, err := sim.Fig5(trace.Conversation()[:2000], sim.Config{Admission: conductor.RejectNone})
	require.NoError(t, err)
	var m []float64
	for _, r := range rs {
		m = append(m, r.Summary().TTFTMeanS)
	}
	t.Logf("mean TTFT (s): global %.2f, local %.2f, load-balance %.2f, random %.2f", m[0], m[1], m[2], m[3])
	assert.Less(t, m[0], 0.9*m[1], "global-cache-aware at least 10%% below local-cache-aware")
	assert.Less(t, m[1], m[2], "local-cache-aware below load-balance")
	assert.Less(t, m[2], m[3], "load-balance below random")
}

// Fig. 9's LRU, by hand: a 2-block cache and a trace whose reuse it can
// and cannot hold.
func TestFig9(t *testing.T) {
	reqs := []trace.Request{
		req(0, 1024, 1, 1, 2),
		req(1, 1536, 1, 1, 2, 3), // reuses 1, 2
		req(2, 512, 1, 4),
		req(3, 1024, 1, 1, 2), // a 2-block cache lost 1 (it kept 4, 3... by recency)
	}
	h := sim.Fig9(reqs, []int64{1024, 1 << 20})
	// Infinite: 1024 + 1024 reused of 1024+1536+512+1024 tokens.
	assert.InDelta(t, 2048.0/4096, h.Infinite, 1e-9)
	assert.InDelta(t, 2048.0/4096, h.Ratios[1], 1e-9)
	// Two blocks: after request 2 the cache holds {2, 1} (a prompt's head
	// is the most recent); request 3 leaves {4, 1}; request 4 reuses 1.
	assert.InDelta(t, (1024.0+512)/4096, h.Ratios[0], 1e-9)
	caps := sim.Fig9Capacities()
	assert.Equal(t, int64(1e4), caps[0])
	assert.Equal(t, int64(1e9), caps[len(caps)-1])
}

// Requests out of time order are an error, not a silent reordering.
func TestDecreasingTimestamps(t *testing.T) {
	_, err := sim.Run(sim.Config{}, []trace.Request{req(10, 512, 1, 1), req(5, 512, 1, 2)})
	require.ErrorIs(t, err, sim.ErrOrder)
	assert.Contains(t, err.Error(), "request 2 of the trace (from 1) arrives at 5 ms")
}

// The Parquet file reads back with its columns and one row per request.
func TestWriteParquet(t *testing.T) {
	res, err := sim.Run(sim.Config{Prefill: 2, Decode: 1, MaxRequests: 50, RateScale: 20}, trace.Conversation())
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "sim.parquet")
	require.NoError(t, res.WriteParquet(path))

	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	f, err := file.OpenParquetFile(path, false)
	require.NoError(t, err)
	defer f.Close()
	rd, err := pqarrow.NewFileReader(f, pqarrow.ArrowReadProperties{}, mem)
	require.NoError(t, err)
	tbl, err := rd.ReadTable(context.Background())
	require.NoError(t, err)
	defer tbl.Release()
	require.EqualValues(t, 50, tbl.NumRows())
	var names []string
	for _, fld := range tbl.Schema().Fields() {
		names = append(names, fld.Name)
	}
	assert.Equal(t, sim.ParquetColumns(), names)
	col := func(name string) arrow.Array {
		i := tbl.Schema().FieldIndices(name)[0]
		return tbl.Column(i).Data().Chunk(0)
	}
	ttft, rej := col("ttft_ns").(*array.Int64), col("rejected").(*array.Boolean)
	hit, inst := col("hit_tokens").(*array.Int32), col("prefill_instance").(*array.String)
	for i, o := range res.Outcomes {
		assert.Equal(t, int64(o.TTFT), ttft.Value(i))
		assert.Equal(t, o.Rejected, rej.Value(i))
		assert.Equal(t, int32(o.HitTokens), hit.Value(i))
		assert.Equal(t, o.Prefill, inst.Value(i))
	}
}

// The summary counts what the outcomes say.
func TestSummary(t *testing.T) {
	cfg := sim.Config{Prefill: 1, Decode: 1, PrefillModel: simplePrefill, DecodeModel: simpleDecode,
		TTFTSLO: 2 * time.Second}
	reqs := []trace.Request{
		req(0, 1024, 3, 1, 2),
		// Predicted TTFT 0.1 + 4 s: rejected.
		req(10, 4096, 3, 5, 6, 7, 8, 9, 10, 11, 12),
	}
	res, err := sim.Run(cfg, reqs)
	require.NoError(t, err)
	s := res.Summary()
	assert.Equal(t, "global-cache-aware+reject", s.Policy)
	assert.Equal(t, 2, s.Requests)
	assert.Equal(t, 1, s.Rejected)
	assert.True(t, res.Outcomes[1].Rejected)
	assert.Equal(t, "ttft", res.Outcomes[1].Reason)
	assert.InDelta(t, 1.124, s.TTFTMeanS, 1e-9)
	assert.InDelta(t, 0.5, s.EffectiveRequestRatio, 1e-9, "TBT 30 ms + tail is within 100 ms")
	assert.InDelta(t, 2.0, s.TTFTSLOS, 1e-9)
}

// Capacity is the highest load up to which every load kept the target.
func TestCapacity(t *testing.T) {
	c := sim.Capacity{Rates: []float64{0.5, 1, 2}, Thresholds: []time.Duration{ms(100)},
		Ratios: [][][]float64{{{0.99}, {0.95}, {0.5}}, {{0.8}, {0.95}, {0.95}}}}
	assert.Equal(t, 1.0, c.At(0, 0, 0.9))
	assert.Equal(t, 0.0, c.At(1, 0, 0.9), "the lowest load already falls short")
	assert.Equal(t, 2.0, c.At(1, 0, 0.5))

	got, err := sim.Fig1Capacity(trace.Conversation()[:150], sim.Config{}, []float64{1, 4}, sim.Fig1Thresholds(), 2)
	require.NoError(t, err)
	require.Len(t, got.Ratios, len(sim.Fig1Names))
	for s := range got.Ratios {
		require.Len(t, got.Ratios[s], 2)
		for r := range got.Ratios[s] {
			require.Len(t, got.Ratios[s][r], len(got.Thresholds))
			for _, v := range got.Ratios[s][r] {
				assert.True(t, v >= 0 && v <= 1, "ratio %g", v)
			}
		}
	}
}

// Cache load balancing by hand: a hot 4-block prefix requested three
// times while its holder is busy. The global policy routes the second and
// third requests away, to instances that pull the prefix and keep it: its
// blocks gain replicas over time, 1, then 3. The local policy queues them
// on the holder (waiting is cheaper than recomputing): 1 replica
// throughout.
func TestReplicas(t *testing.T) {
	cfg := sim.Config{Prefill: 3, Decode: 1, PrefillModel: simplePrefill, DecodeModel: simpleDecode,
		Admission: conductor.RejectNone, OutputTokens: 1, ReplicaInterval: time.Second, HotBlocks: 4,
		// A block pulls in 25 ms: the prefix in 100 ms.
		Bandwidth: float64(conductor.DefaultBlockBytes) / 0.025}
	reqs := []trace.Request{
		// A: p0, every instance idle and empty; predicted 0.1 + 2.56 s.
		req(0, 2560, 1, 1, 2, 3, 4, 10),
		// B: global: p0 would wait 1.56 s then take 0.612 s, p1 pulls in
		// 0.1 s and takes 0.612 s: p1. Local: p0 (2.172 s) beats
		// recomputing everything on p1 (2.66 s).
		req(1100, 2560, 1, 1, 2, 3, 4, 11),
		// C: global: p0 1.772 s, p1 (B predicted done at 1.712 s) 0.824 s,
		// p2 0.712 s: p2. Local: p0 waits 1.772 s, then 0.612 s: 2.384 s,
		// still below 2.66 s.
		req(1500, 2560, 1, 1, 2, 3, 4, 12),
	}
	type sample struct {
		at     time.Duration
		blocks []int
		max    int
		hot    float64
	}
	samples := func(r *sim.Result) []sample {
		var out []sample
		for _, s := range r.Replicas {
			assert.Equal(t, 4, s.HotBlocks)
			assert.Equal(t, len(s.Blocks)-1, s.Max)
			out = append(out, sample{s.At, s.Blocks, s.Max, s.HotMean})
		}
		return out
	}

	cfg.Policy = conductor.GlobalCacheAware
	res, err := sim.Run(cfg, reqs)
	require.NoError(t, err)
	for i, want := range []string{"p0", "p1", "p2"} {
		assert.Equal(t, want, res.Outcomes[i].Prefill, "request %d", i)
	}
	// At 1 s: A's 5 blocks on p0. From 2 s: blocks 1-4 on 3 instances,
	// the unique last blocks on one each; the hot blocks are 1-4 (3
	// requests each). The end: C's prefill, pulling nothing (p0 has not
	// finished A when C starts), ends at 1.5 + 2.66 s.
	one := []int{0, 5}
	three := []int{0, 3, 0, 4}
	assert.Equal(t, []sample{
		{time.Second, one, 1, 1},
		{2 * time.Second, three, 3, 3},
		{3 * time.Second, three, 3, 3},
		{4 * time.Second, three, 3, 3},
		{ms(4160), three, 3, 3},
	}, samples(res))
	s := res.Summary()
	assert.Equal(t, 3, s.ReplicasMax)
	assert.InDelta(t, (1+3+3+3+3)/5.0, s.HotBlockReplicasMean, 1e-9)

	cfg.Policy = conductor.LocalCacheAware
	res, err = sim.Run(cfg, reqs)
	require.NoError(t, err)
	for i := range reqs {
		assert.Equal(t, "p0", res.Outcomes[i].Prefill, "request %d", i)
	}
	// p0 runs A, then B and C from its cache (0.612 s each): the end is
	// at 2.66 + 2 x 0.612 s.
	assert.Equal(t, []sample{
		{time.Second, one, 1, 1},
		{2 * time.Second, []int{0, 7}, 1, 1},
		{3 * time.Second, []int{0, 7}, 1, 1},
		{ms(3884), []int{0, 7}, 1, 1},
	}, samples(res))
	s = res.Summary()
	assert.Equal(t, 1, s.ReplicasMax)
	assert.InDelta(t, 1, s.HotBlockReplicasMean, 1e-9)

	// The coupled baseline has no index; a negative interval samples
	// nothing.
	cfg.Coupled = true
	res, err = sim.Run(cfg, reqs)
	require.NoError(t, err)
	assert.Empty(t, res.Replicas)
	assert.Zero(t, res.Summary().ReplicasMax)
	cfg.Coupled, cfg.ReplicaInterval = false, -1
	res, err = sim.Run(cfg, reqs)
	require.NoError(t, err)
	assert.Empty(t, res.Replicas)

	_, err = sim.Run(sim.Config{HotBlocks: -1}, nil)
	assert.ErrorIs(t, err, sim.ErrInvalid)
	assert.ErrorContains(t, err, "Config.HotBlocks")
}

// On the trace, the global policy replicates the hot blocks more than the
// local one, and the CSV and the plot come out.
func TestReplicasTrace(t *testing.T) {
	reqs := trace.Conversation()[:3000]
	run := func(p conductor.Policy) *sim.Result {
		res, err := sim.Run(sim.Config{Policy: p, Admission: conductor.RejectNone}, reqs)
		require.NoError(t, err)
		return res
	}
	g, l := run(conductor.GlobalCacheAware), run(conductor.LocalCacheAware)
	last := g.Replicas[len(g.Replicas)-1]
	assert.InDelta(t, g.Summary().SimulatedS, last.At.Seconds(), 1e-9, "the last sample is at the end")
	for i, s := range g.Replicas[:len(g.Replicas)-1] {
		assert.Equal(t, time.Duration(i+1)*time.Minute, s.At)
		assert.Equal(t, 100, s.HotBlocks)
		assert.GreaterOrEqual(t, float64(s.Max), s.HotMean)
	}
	t.Logf("hot-block replicas, mean over time: global %.2f, local %.2f",
		g.Summary().HotBlockReplicasMean, l.Summary().HotBlockReplicasMean)
	assert.Greater(t, g.Summary().HotBlockReplicasMean, l.Summary().HotBlockReplicasMean)

	dir := t.TempDir()
	csv := filepath.Join(dir, "replicas.csv")
	require.NoError(t, g.WriteReplicasCSV(csv))
	b, err := os.ReadFile(csv)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, len(g.Replicas)+1)
	assert.Equal(t, strings.Join(sim.ReplicaColumns(g.ReplicasMax()), ","), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "60,"), lines[1])
	require.NoError(t, sim.PlotReplicas(filepath.Join(dir, "replicas.png"), g, l))
}

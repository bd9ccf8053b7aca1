package conductor_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

// The tests run the scheduler on time models simple enough to predict by
// hand:
//
//   - prefill: 1 us per new token, nothing else (a 512-token block is
//     512 us to recompute);
//   - transfer: 100-byte blocks at 1 MB/s, 100 us per block;
//   - decode: TBT(b, k) = max(10 ms, b x 1 ms) + k x 0.1 us.
var (
	testPrefill = conductor.PrefillModel{Linear: 1e-6}
	testDecode  = conductor.DecodeModel{Weights: 10e-3, PerSeq: 1e-3, PerKVToken: 1e-7}
)

const ms, us = time.Millisecond, time.Microsecond

// testConfig is the simple models with admission off; callers change the
// rest.
func testConfig() conductor.Config {
	return conductor.Config{
		Admission:  conductor.RejectNone,
		Prefill:    testPrefill,
		Decode:     testDecode,
		BlockBytes: 100,
		Bandwidth:  1e6,
	}
}

// newScheduler returns a scheduler on cfg with the instances: names
// starting with "p" are prefill instances with a cache of 1000 blocks,
// "q" prefill instances without a cache, the others decode instances.
func newScheduler(t testing.TB, cfg conductor.Config, ids ...string) *conductor.Scheduler {
	t.Helper()
	s, err := conductor.New(cfg)
	require.NoError(t, err)
	for _, id := range ids {
		in := conductor.Instance{ID: id, Role: conductor.Decode}
		switch id[0] {
		case 'p':
			in = conductor.Instance{ID: id, Role: conductor.Prefill, CacheBlocks: 1000}
		case 'q':
			in = conductor.Instance{ID: id, Role: conductor.Prefill}
		}
		require.NoError(t, s.Add(in))
	}
	return s
}

// span returns the blocks from, from+1, ..., from+n-1.
func span(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// req is a request of n whole blocks and a long output.
func req(id string, blocks []uint64) conductor.Request {
	return conductor.Request{ID: id, Tokens: len(blocks) * conductor.BlockTokens, Output: 1000, Blocks: blocks}
}

// busy is a request of tokens with no blocks anyone could hold: load.
func busy(id string, tokens int) conductor.Request {
	return conductor.Request{ID: id, Tokens: tokens, Output: 1000}
}

func TestSchedulePrefixReuse(t *testing.T) {
	// p0 holds the first half of an 8-block prompt. Recomputing the
	// prompt on p1 takes 4096 us; on p0, the 4 new blocks take 2048 us;
	// pulling p0's prefix to p1 would add 400 us to those. p0 wins.
	s := newScheduler(t, testConfig(), "p0", "p1", "d0")
	prompt := span(1, 8)
	s.BlockStored("p0", prompt[:4])
	d, err := s.Schedule(0, req("r", prompt))
	require.NoError(t, err)
	assert.Equal(t, conductor.Decision{Prefill: "p0", Decode: "d0", Reused: 4, TTFT: 2048 * us,
		TBT: 10*ms + 409600*time.Nanosecond}, d)
	// The decision is recorded: p0 now holds the whole prompt.
	assert.Equal(t, map[string]int{"p0": 8}, s.Longest(prompt))
}

func TestScheduleAlgorithm1(t *testing.T) {
	// p0 holds blocks 1-4 of the 8-block prompt and has a queue: a busy
	// request scheduled first (both instances idle, so the first
	// registered, p0, takes it). Then the prompt arrives at time at.
	//
	// On p0: its queue left at that time + 2048 us for 4 new blocks.
	// On p1, when 4 - 0 > BalanceBlocks: pull 4 blocks (400 us) + 2048 us
	// = 2448 us; otherwise recompute all: 4096 us.
	for _, tc := range []struct {
		name    string
		policy  conductor.Policy
		balance int
		queue   int           // busy tokens queued on p0, in us of prefill
		at      time.Duration // arrival of the prompt
		want    conductor.Decision
	}{
		// A long queue pushes the request off its prefix's holder: p1 pulls
		// the prefix (2448 us < 10000 + 2048 us).
		{"pull", conductor.GlobalCacheAware, 0, 10000, 0,
			conductor.Decision{Prefill: "p1", Reused: 4, Pulled: 4, Source: "p0", TTFT: 2448 * us}},
		// The threshold is strict: 4 blocks more than p1's 0 is more than 3.
		{"threshold 3", conductor.GlobalCacheAware, 3, 10000, 0,
			conductor.Decision{Prefill: "p1", Reused: 4, Pulled: 4, Source: "p0", TTFT: 2448 * us}},
		// But not more than 4: p1 does not consider the transfer, and still
		// beats p0 recomputing everything (4096 us < 12048 us).
		{"threshold 4", conductor.GlobalCacheAware, 4, 10000, 0,
			conductor.Decision{Prefill: "p1", TTFT: 4096 * us}},
		// With a short queue on p0, the threshold decides the instance: a
		// pull wins (2448 us < 1000 + 2048 us)...
		{"short queue, pull", conductor.GlobalCacheAware, 0, 1000, 0,
			conductor.Decision{Prefill: "p1", Reused: 4, Pulled: 4, Source: "p0", TTFT: 2448 * us}},
		// ... and without it the holder does (3048 us < 4096 us).
		{"short queue, no pull", conductor.GlobalCacheAware, 4, 1000, 0,
			conductor.Decision{Prefill: "p0", Reused: 4, TTFT: 3048 * us}},
		// Queue time is what is left: 9 ms into p0's 10 ms head, its queue
		// is 1 ms.
		{"queue drains", conductor.GlobalCacheAware, 4, 10000, 9 * ms,
			conductor.Decision{Prefill: "p0", Reused: 4, TTFT: 3048 * us}},
		// Local-cache-aware never pulls, whatever the threshold.
		{"local", conductor.LocalCacheAware, 0, 10000, 0,
			conductor.Decision{Prefill: "p1", TTFT: 4096 * us}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Policy, cfg.BalanceBlocks = tc.policy, tc.balance
			s := newScheduler(t, cfg, "p0", "p1", "d0")
			prompt := span(1, 8)
			s.BlockStored("p0", prompt[:4])
			d, err := s.Schedule(0, busy("busy", tc.queue))
			require.NoError(t, err)
			require.Equal(t, "p0", d.Prefill)
			assert.Equal(t, 1, s.Replicas(1))

			d, err = s.Schedule(tc.at, req("r", prompt))
			require.NoError(t, err)
			d.Decode, d.TBT = "", 0
			assert.Equal(t, tc.want, d)

			// The chosen instance holds the whole prompt now, pulled or
			// recomputed: blocks 1-4 gain a replica when p1 was chosen.
			want := map[string]int{"p0": 4, tc.want.Prefill: 8}
			assert.Equal(t, want, s.Longest(prompt))
			assert.Equal(t, len(want), s.Replicas(1))
			assert.Equal(t, 1, s.Replicas(8))
		})
	}
}

func TestScheduleFromStore(t *testing.T) {
	// Only the store has the prefix (6 blocks): both instances pull it
	// (600 us) and compute 2 blocks (1024 us); the first registered wins.
	s := newScheduler(t, testConfig(), "p0", "p1", "d0")
	prompt := span(1, 8)
	s.StoreAdded(prompt[:6])
	assert.Zero(t, s.Replicas(1), "the store is not a replica on a prefill instance")
	d, err := s.Schedule(0, req("r", prompt))
	require.NoError(t, err)
	assert.Equal(t, "p0", d.Prefill)
	assert.Equal(t, conductor.StoreHolder, d.Source)
	assert.Equal(t, 6, d.Reused)
	assert.Equal(t, 6, d.Pulled)
	assert.Equal(t, 1624*us, d.TTFT)
	assert.Equal(t, map[string]int{conductor.StoreHolder: 6, "p0": 8}, s.Longest(prompt))
	assert.Equal(t, 1, s.Replicas(1))

	// Evicted from the store, the prefix is only p0's.
	s.StoreEvicted(prompt[:6])
	assert.Equal(t, map[string]int{"p0": 8}, s.Longest(prompt))
}

func TestScheduleHotPrefixReplicas(t *testing.T) {
	// Requests share a hot 8-block prefix and each adds 8 blocks of its
	// own (8192 tokens), all at time 0. The first computes everything on
	// p0 (8192 us). Then p0's queue pushes the next ones away, and each
	// instance it pushes them to pulls the prefix (800 us + 4096 us =
	// 4896 us), until every instance holds it and the least loaded one
	// reuses its own copy: the hot blocks gain replicas with load, with no
	// forecast.
	s := newScheduler(t, testConfig(), "p0", "p1", "p2", "p3", "d0")
	hot := span(1, 8)
	type step struct {
		prefill  string
		pulled   int
		ttft     time.Duration
		replicas int
	}
	want := []step{
		{"p0", 0, 8192 * us, 1},
		// p0: 8192 + 4096 us; p1: 4896 us.
		{"p1", 8, 4896 * us, 2},
		{"p2", 8, 4896 * us, 3},
		{"p3", 8, 4896 * us, 4},
		// p0: 12288 us; p1, p2, p3: 4096 us queued + 4096 us.
		{"p1", 0, 8192 * us, 4},
	}
	var got []step
	for i := range want {
		d, err := s.Schedule(0, req(fmt.Sprint("r", i), append(slices.Clone(hot), span(uint64(100*(i+1)), 8)...)))
		require.NoError(t, err)
		got = append(got, step{d.Prefill, d.Pulled, d.TTFT, s.Replicas(hot[0])})
	}
	assert.Equal(t, want, got)
	assert.Equal(t, 4, s.Replicas(hot[7]))
	assert.Equal(t, 1, s.Replicas(100), "a request's own blocks have one copy")
}

func TestScheduleDecode(t *testing.T) {
	// One prefill instance without a cache queues the requests one after
	// the other; three decode instances. A request of n tokens reaches
	// decode when the queue before it and its own n us are done.
	s := newScheduler(t, testConfig(), "q0", "d0", "d1", "d2")
	type step struct {
		decode    string
		ttft, tbt time.Duration
	}
	for i, tc := range []struct {
		tokens int
		want   step
	}{
		// All idle: 10 ms + 5 ms of KV on the first registered.
		{50000, step{"d0", 50 * ms, 15 * ms}},
		// d0 would be 10 + (50000 + 1000) x 0.1 us; d1 is idle.
		{1000, step{"d1", 51 * ms, 10100 * us}},
		{1000, step{"d2", 52 * ms, 10100 * us}},
		// d1 and d2 have one short request each: 10.2 ms, the first wins.
		{1000, step{"d1", 53 * ms, 10200 * us}},
		// Now d1 has two (10.3 ms), d2 one (10.2 ms)...
		{1000, step{"d2", 54 * ms, 10200 * us}},
		// ... and three short ones less than one long (d0: 15.1 ms): the
		// least TBT, not the fewest requests.
		{1000, step{"d1", 55 * ms, 10300 * us}},
	} {
		d, err := s.Schedule(0, busy(fmt.Sprint("r", i), tc.tokens))
		require.NoError(t, err)
		assert.Equal(t, tc.want, step{d.Decode, d.TTFT, d.TBT}, "request %d", i)
	}
}

func TestScheduleAdmission(t *testing.T) {
	// One prefill and one decode instance; TBT SLO 25 ms. r1 (100000
	// tokens) is scheduled at time 0: TTFT 100 ms, TBT 10 + 10 = 20 ms,
	// admitted. What happens to the next request depends on r1's output
	// and progress, and on the admission control.
	const long = 100000
	for _, tc := range []struct {
		name      string
		admission conductor.Admission
		output    int           // r1's output tokens
		prefilled bool          // r1 reached decode at 100 ms
		ttftSLO   time.Duration // zero: the default, 30 s
		kvTokens  int           // decode KV capacity; zero: unbounded
		want      *conductor.RejectError
	}{
		// r2 (60000 tokens) at time 0 queues behind r1: TTFT 160 ms. By
		// then r1 decodes (3 tokens out at 20 ms each), so r2 would see
		// TBT 10 + (60000 + 100003) x 0.1 us = 26.0003 ms: rejected...
		{"predicted rejects", conductor.RejectPredicted, 1000, false, 0, 0,
			&conductor.RejectError{Reason: "tbt", Predicted: 26000300, SLO: 25 * ms}},
		// ... while the naive control sees d0 idle (r1 is still in
		// prefill): 10 + 6 ms, admitted, and r2 will break the SLO.
		{"naive admits", conductor.RejectCurrentLoad, 1000, false, 0, 0, nil},
		// r1 reached decode at 100 ms and will have finished its 2 tokens
		// by the time r2, arriving then, reaches decode (160 ms): r2 alone
		// is 16 ms, admitted...
		{"predicted admits", conductor.RejectPredicted, 2, true, 0, 0, nil},
		// ... while the naive control counts r1 as it is now: 10 +
		// (60000 + 100000) x 0.1 us = 26 ms, rejected for nothing.
		{"naive rejects", conductor.RejectCurrentLoad, 2, true, 0, 0,
			&conductor.RejectError{Reason: "tbt", Predicted: 26 * ms, SLO: 25 * ms}},
		// Both reject a TTFT over its SLO, checked first: 160 ms > 150 ms.
		{"ttft predicted", conductor.RejectPredicted, 1000, false, 150 * ms, 0,
			&conductor.RejectError{Reason: "ttft", Predicted: 160 * ms, SLO: 150 * ms}},
		{"ttft naive", conductor.RejectCurrentLoad, 1000, false, 150 * ms, 0,
			&conductor.RejectError{Reason: "ttft", Predicted: 160 * ms, SLO: 150 * ms}},
		// With room for 150000 tokens of KV cache, r1 takes 101000 and r2
		// would need 61000 more: rejected when predicted...
		{"kv memory", conductor.RejectPredicted, 1000, false, 0, 150000,
			&conductor.RejectError{Reason: "kv-memory"}},
		// ... admitted by the naive control.
		{"kv memory naive", conductor.RejectCurrentLoad, 1000, false, 0, 150000, nil},
		// Without admission control, everything goes.
		{"none", conductor.RejectNone, 1000, false, 150 * ms, 150000, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Admission, cfg.TBTSLO, cfg.TTFTSLO = tc.admission, 25*ms, tc.ttftSLO
			cfg.Decode.KVTokens = tc.kvTokens
			s := newScheduler(t, cfg, "q0", "d0")
			d, err := s.Schedule(0, conductor.Request{ID: "r1", Tokens: long, Output: tc.output})
			require.NoError(t, err)
			require.Equal(t, 100*ms, d.TTFT)
			require.Equal(t, 20*ms, d.TBT)
			at := time.Duration(0)
			if tc.prefilled {
				at = 100 * ms
				s.PrefillDone(at, "r1")
			}

			d, err = s.Schedule(at, conductor.Request{ID: "r2", Tokens: 60000, Output: 1000})
			assert.Equal(t, "q0", d.Prefill, "a rejected decision still says where")
			assert.Equal(t, "d0", d.Decode)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, conductor.ErrRejected)
			var re *conductor.RejectError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, tc.want, re)

			// Nothing of a rejected request is recorded: a probe sees r1's
			// queue only (100 ms at time 0), and r2's ID is free.
			s.DecodeDone(at, "r1")
			d, err = s.Schedule(0, conductor.Request{ID: "r2", Tokens: 1000, Output: 1})
			require.NoError(t, err)
			assert.Equal(t, time.Millisecond, d.TTFT)
			assert.Equal(t, 10100*us, d.TBT)
		})
	}
}

func TestRejectErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		err  *conductor.RejectError
		want string
	}{
		{&conductor.RejectError{Reason: "ttft", Predicted: 31*time.Second + 1234567, SLO: 30 * time.Second},
			"conductor: rejected: predicted TTFT 31.001235s exceeds the SLO 30s"},
		{&conductor.RejectError{Reason: "tbt", Predicted: 120 * ms, SLO: 100 * ms},
			"conductor: rejected: predicted TBT 120ms exceeds the SLO 100ms"},
		{&conductor.RejectError{Reason: "kv-memory"},
			"conductor: rejected: no decode instance has room for the KV cache"},
	} {
		assert.Equal(t, tc.want, tc.err.Error())
		assert.True(t, errors.Is(tc.err, conductor.ErrRejected))
	}
}

func TestSchedulerInstances(t *testing.T) {
	s, err := conductor.New(testConfig())
	require.NoError(t, err)
	r := busy("r", 1000)

	// No instance at all, then no decode instance.
	_, err = s.Schedule(0, r)
	require.ErrorIs(t, err, conductor.ErrNoInstance)
	require.NoError(t, s.Add(conductor.Instance{ID: "p0", Role: conductor.Prefill, CacheBlocks: 10}))
	_, err = s.Schedule(0, r)
	require.ErrorIs(t, err, conductor.ErrNoInstance)
	require.NoError(t, s.Add(conductor.Instance{ID: "d0", Role: conductor.Decode}))

	for _, tc := range []struct {
		name string
		in   conductor.Instance
		want error
	}{
		// IDs are unique across roles.
		{"duplicate", conductor.Instance{ID: "p0", Role: conductor.Prefill}, conductor.ErrDuplicate},
		{"duplicate across roles", conductor.Instance{ID: "p0", Role: conductor.Decode}, conductor.ErrDuplicate},
		// The store's holder name is taken.
		{"store", conductor.Instance{ID: conductor.StoreHolder, Role: conductor.Prefill}, conductor.ErrDuplicate},
		{"no ID", conductor.Instance{Role: conductor.Prefill}, conductor.ErrInvalid},
		{"no role", conductor.Instance{ID: "x"}, conductor.ErrInvalid},
		{"bad role", conductor.Instance{ID: "x", Role: 7}, conductor.ErrInvalid},
		{"negative cache", conductor.Instance{ID: "x", Role: conductor.Prefill, CacheBlocks: -1}, conductor.ErrInvalid},
	} {
		assert.ErrorIs(t, s.Add(tc.in), tc.want, tc.name)
	}
	assert.ErrorIs(t, s.Remove("nobody"), conductor.ErrUnknown)

	for _, tc := range []struct {
		name string
		r    conductor.Request
	}{
		{"no ID", conductor.Request{Tokens: 1}},
		{"negative tokens", conductor.Request{ID: "x", Tokens: -1}},
		{"negative output", conductor.Request{ID: "x", Output: -1}},
	} {
		_, err := s.Schedule(0, tc.r)
		assert.ErrorIs(t, err, conductor.ErrInvalid, tc.name)
	}

	// A request in flight cannot be scheduled twice, even after its
	// instances are gone.
	prompt := span(1, 4)
	_, err = s.Schedule(0, req("r", prompt))
	require.NoError(t, err)
	_, err = s.Schedule(0, req("r", prompt))
	require.ErrorIs(t, err, conductor.ErrDuplicate)
	assert.Equal(t, map[string]int{"p0": 4}, s.Longest(prompt))

	// A removed prefill instance forgets its cache; its requests stay in
	// flight until done.
	require.NoError(t, s.Remove("p0"))
	assert.Empty(t, s.Longest(prompt))
	assert.Zero(t, s.Replicas(1))
	_, err = s.Schedule(0, req("r2", prompt))
	require.ErrorIs(t, err, conductor.ErrNoInstance)
	_, err = s.Schedule(0, req("r", prompt))
	require.ErrorIs(t, err, conductor.ErrDuplicate)
	s.PrefillDone(ms, "r")
	s.DecodeDone(2*ms, "r")

	// Added again, p0 starts empty and idle; so does a replacement for
	// the removed decode instance.
	require.NoError(t, s.Remove("d0"))
	require.NoError(t, s.Add(conductor.Instance{ID: "p0", Role: conductor.Prefill, CacheBlocks: 10}))
	require.NoError(t, s.Add(conductor.Instance{ID: "d1", Role: conductor.Decode}))
	d, err := s.Schedule(3*ms, req("r", prompt))
	require.NoError(t, err)
	assert.Equal(t, conductor.Decision{Prefill: "p0", Decode: "d1", TTFT: 2048 * us, TBT: 10*ms + 204800},
		d)
}

func TestSchedulerLifecycle(t *testing.T) {
	s := newScheduler(t, testConfig(), "q0", "d0")
	// probe is the queue time at now: the TTFT of a 1000-token request
	// less its 1 ms of prefill; the probe then leaves.
	probe := func(now time.Duration) time.Duration {
		t.Helper()
		d, err := s.Schedule(now, busy("probe", 1000))
		require.NoError(t, err)
		s.DecodeDone(now, "probe")
		return d.TTFT - ms
	}
	_, err := s.Schedule(0, busy("r1", 10000))
	require.NoError(t, err)
	_, err = s.Schedule(0, busy("r2", 10000))
	require.NoError(t, err)
	assert.Equal(t, 20*ms, probe(0))
	// The head has run 4 ms of its 10.
	assert.Equal(t, 16*ms, probe(4*ms))
	// A head running late counts no less than the rest of the queue.
	assert.Equal(t, 10*ms, probe(15*ms))

	// r1 is done at 15 ms: r2 runs from then.
	s.PrefillDone(15*ms, "r1")
	assert.Equal(t, 10*ms, probe(15*ms))
	// Repeated and unknown calls change nothing.
	s.PrefillDone(16*ms, "r1")
	s.PrefillDone(16*ms, "nobody")
	s.DecodeDone(16*ms, "nobody")
	assert.Equal(t, 9*ms, probe(16*ms))

	// r2 is cancelled before its prefill finished: the queue empties.
	s.DecodeDone(17*ms, "r2")
	assert.Zero(t, probe(17*ms))
	s.PrefillDone(18*ms, "r2")
	assert.Zero(t, probe(18*ms))

	// r1 decodes on d0 (joined at 15 ms, a token every 11 ms predicted):
	// a request reaching d0 at 19 ms + 1 ms is predicted 10 ms + (1000 +
	// 10000 + 0) x 0.1 us.
	d, err := s.Schedule(19*ms, busy("r3", 1000))
	require.NoError(t, err)
	assert.Equal(t, 11100*us, d.TBT)
	s.DecodeDone(19*ms, "r3")
	s.DecodeDone(20*ms, "r1")
	// Everything is done: an idle scheduler, and the IDs are free again.
	d, err = s.Schedule(21*ms, busy("r1", 1000))
	require.NoError(t, err)
	assert.Equal(t, conductor.Decision{Prefill: "q0", Decode: "d0", TTFT: ms, TBT: 10100 * us}, d)
}

func TestSchedulePolicies(t *testing.T) {
	// p0 holds the whole 8-block prompt and has 0.5 ms queued (the busy
	// request, which every policy sends to p0: all idle, first wins).
	prompt := span(1, 8)
	for _, tc := range []struct {
		policy conductor.Policy
		want   conductor.Decision
	}{
		// The cache-aware policies reuse p0's copy: 0.5 ms of queue,
		// nothing to compute (pulling it to p1 would take 0.8 ms).
		{conductor.GlobalCacheAware, conductor.Decision{Prefill: "p0", Reused: 8, TTFT: 500 * us}},
		{conductor.LocalCacheAware, conductor.Decision{Prefill: "p0", Reused: 8, TTFT: 500 * us}},
		// Load balance goes to the idle p1 and recomputes it all.
		{conductor.LoadBalance, conductor.Decision{Prefill: "p1", TTFT: 4096 * us}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			cfg := testConfig()
			cfg.Policy = tc.policy
			s := newScheduler(t, cfg, "p0", "p1", "d0")
			s.BlockStored("p0", prompt)
			d, err := s.Schedule(0, busy("busy", 500))
			require.NoError(t, err)
			require.Equal(t, "p0", d.Prefill)
			d, err = s.Schedule(0, req("r", prompt))
			require.NoError(t, err)
			d.Decode, d.TBT = "", 0
			assert.Equal(t, tc.want, d)
		})
	}
}

func TestScheduleRandom(t *testing.T) {
	// The random policy is deterministic with a seed, reuses only the
	// prefix the instance it picks holds, and never pulls.
	picks := func(seed uint64) []string {
		cfg := testConfig()
		cfg.Policy, cfg.Seed = conductor.Random, seed
		s := newScheduler(t, cfg, "p0", "p1", "p2", "p3", "d0")
		prompt := span(1, 4)
		s.BlockStored("p2", prompt)
		var out []string
		for i := range 40 {
			d, err := s.Schedule(0, req(fmt.Sprint("r", i), append(slices.Clone(prompt), uint64(100+i))))
			require.NoError(t, err)
			require.Zero(t, d.Pulled)
			if d.Prefill == "p2" {
				require.Equal(t, 4, d.Reused)
			}
			out = append(out, d.Prefill)
		}
		return out
	}
	a := picks(1)
	assert.Equal(t, a, picks(1), "same seed, same picks")
	assert.NotEqual(t, a, picks(2), "another seed, other picks")
	for _, p := range []string{"p0", "p1", "p2", "p3"} {
		assert.Contains(t, a, p, "40 picks cover 4 instances")
	}
}

func TestSchedulerConcurrent(t *testing.T) {
	// Many goroutines schedule, complete and query at once (run with
	// -race); afterwards nothing is left in flight.
	s := newScheduler(t, testConfig(), "p0", "p1", "p2", "p3", "d0", "d1")
	const workers, each = 8, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				now := time.Duration(i) * ms
				prompt := append(span(1, 4), span(uint64(1000*(w+1)+i), 2)...)
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := s.Schedule(now, req(id, prompt)); err != nil {
					errs <- err
					return
				}
				s.StoreAdded(prompt[4:])
				_ = s.Longest(prompt)
				_ = s.Replicas(prompt[0])
				s.PrefillDone(now+ms, id)
				s.DecodeDone(now+2*ms, id)
				s.StoreEvicted(prompt[5:])
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Idle everywhere: 4 new blocks of 6 on a holder of the hot prefix.
	d, err := s.Schedule(time.Second, req("last", append(span(1, 4), 7, 8)))
	require.NoError(t, err)
	assert.Equal(t, 4, d.Reused)
	assert.Equal(t, 1024*us, d.TTFT)
	assert.Equal(t, 10*ms+307200, d.TBT)
}

func TestScheduleEvictsOwnPrefix(t *testing.T) {
	// p0 keeps 2 blocks: 2 and, least recently used, 1. A prompt 1, 3, 4
	// reuses block 1, but inserting it (last block first) evicts 1 on the
	// way before touching it again: p0 ends with the prompt's first two
	// blocks, 1 back in the index.
	s, err := conductor.New(testConfig())
	require.NoError(t, err)
	require.NoError(t, s.Add(conductor.Instance{ID: "p0", Role: conductor.Prefill, CacheBlocks: 2}))
	require.NoError(t, s.Add(conductor.Instance{ID: "d0", Role: conductor.Decode}))
	s.BlockStored("p0", []uint64{1})
	s.BlockStored("p0", []uint64{2})
	prompt := []uint64{1, 3, 4}
	d, err := s.Schedule(0, req("r", prompt))
	require.NoError(t, err)
	assert.Equal(t, 1, d.Reused)
	assert.Equal(t, map[string]int{"p0": 2}, s.Longest(prompt))
	assert.Equal(t, 1, s.Replicas(1))
	assert.Zero(t, s.Replicas(2))
	assert.Zero(t, s.Replicas(4))
}

func TestScheduleLeavesEventFedCachesToTheirEvents(t *testing.T) {
	// p0's KV events feed the index: a decision for it records nothing,
	// its events do (an engine may not cache a prompt it was sent).
	s, err := conductor.New(testConfig())
	require.NoError(t, err)
	require.NoError(t, s.Add(conductor.Instance{ID: "p0", Role: conductor.Prefill, CacheBlocks: 8, Events: true}))
	require.NoError(t, s.Add(conductor.Instance{ID: "d0", Role: conductor.Decode}))
	prompt := []uint64{1, 2, 3}
	_, err = s.Schedule(0, req("r", prompt))
	require.NoError(t, err)
	assert.Equal(t, map[string]int{}, nonZero(s.Longest(prompt)))
	s.BlockStored("p0", prompt[:2])
	assert.Equal(t, map[string]int{"p0": 2}, nonZero(s.Longest(prompt)))
}

func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestSchedulerIndexAgainstIndex(t *testing.T) {
	// The scheduler records a decision's prompt on the chosen instance
	// with the entries its prefix pass found; an Index fed the same blocks
	// through Insert must agree with it, evictions included (small caches,
	// few blocks).
	rng := rand.New(rand.NewPCG(3, 4))
	s := newScheduler(t, testConfig(), "d0")
	x := conductor.NewIndex()
	for i, c := range []int{2, 3, 5, 8} {
		id := fmt.Sprint("p", i)
		require.NoError(t, s.Add(conductor.Instance{ID: id, Role: conductor.Prefill, CacheBlocks: c}))
		require.NoError(t, x.AddHolder(id, c))
	}
	require.NoError(t, x.AddHolder(conductor.StoreHolder, 0))
	prompt := func() []uint64 { return randomPrompt(rng, 8, 16) }
	for i := range 3000 {
		p := prompt()
		switch rng.IntN(8) {
		case 0:
			s.StoreAdded(p)
			x.Insert(conductor.StoreHolder, p)
		case 1:
			s.StoreEvicted(p)
			x.Delete(conductor.StoreHolder, p)
		default:
			id := fmt.Sprint("r", i)
			d, err := s.Schedule(time.Duration(i)*ms, req(id, p))
			require.NoError(t, err)
			x.Insert(d.Prefill, p)
			s.DecodeDone(time.Duration(i)*ms, id)
		}
		q := prompt()
		require.Equal(t, x.Longest(q), s.Longest(q), "step %d", i)
	}
}

package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mooncake-go/mooncake/conductor"
)

// Defaults of Config's zero fields, the paper's setup (§4.1, §5.1, §5.3).
const (
	// DefaultPrefill and DefaultDecode are the instance counts: 16 nodes
	// split 1:1, the ratio §5.5 finds best.
	DefaultPrefill = 8
	DefaultDecode  = 8
	// DefaultLocalTokens is a prefill node's local cache: about 1 TB of
	// DRAM at 320 KiB per token of LLaMA3-70B, 3M tokens (§5.3.1).
	DefaultLocalTokens = 3_000_000
)

// Config is one simulated deployment and how the trace is replayed on it.
type Config struct {
	// Policy picks prefill instances (conductor.Policy); ignored when
	// Coupled.
	Policy conductor.Policy
	// Admission is the early rejection; ignored when Coupled, which, as
	// vLLM, admits everything.
	Admission conductor.Admission
	// Coupled replaces disaggregation by the baseline: Prefill+Decode
	// instances that each run both stages in one continuous batch.
	Coupled bool
	// ChunkTokens, when Coupled, is the token budget of an iteration with
	// chunked prefill (vLLM's max_num_batched_tokens): decode tokens first,
	// then a chunk of the oldest waiting prompt. Zero: no chunking, a
	// prompt's whole prefill runs as one iteration that stalls the batch.
	ChunkTokens int
	// Prefill and Decode are the instance counts; zero: DefaultPrefill,
	// DefaultDecode.
	Prefill, Decode int
	// LocalTokens is the local prefix cache of a prefill instance (a
	// coupled instance), in tokens, kept LRU. Zero: DefaultLocalTokens;
	// negative: no local cache.
	LocalTokens int64
	// StoreTokens is a shared store every prefill writes its blocks to and
	// every instance may pull from, in tokens, LRU. Zero: none; the global
	// policy then pulls from the other instances' local caches.
	StoreTokens int64
	// Bandwidth is what an instance pulls KV cache at, bytes per second;
	// zero: conductor.DefaultBandwidth.
	Bandwidth float64
	// BalanceBlocks is Algorithm 1's kvcache_balancing_threshold
	// (conductor.Config.BalanceBlocks).
	BalanceBlocks int
	// TTFTSLO and TBTSLO are the objectives of admission and of the
	// effective request ratio; zero: conductor's defaults (30 s, 100 ms).
	TTFTSLO, TBTSLO time.Duration
	// PrefillModel and DecodeModel are the time models, both of execution
	// and of the scheduler's predictions; zero: conductor's defaults.
	PrefillModel conductor.PrefillModel
	DecodeModel  conductor.DecodeModel
	// RateScale multiplies the arrival rate: arrivals happen at the trace's
	// timestamps divided by it. Zero: 1, the trace as recorded.
	RateScale float64
	// OutputTokens, when positive, replaces every request's output length
	// (Fig. 10 sets 1 to isolate prefill).
	OutputTokens int
	// MaxRequests replays only the first requests of the trace; zero: all.
	MaxRequests int
	// Seed seeds the Random policy; a run is a function of the Config and
	// the trace.
	Seed uint64
	// ReplicaInterval is how often, in simulated time, a disaggregated
	// replay samples the replicas of the prefix index's blocks
	// (Result.Replicas), plus once at the end; zero:
	// DefaultReplicaInterval; negative: no sampling.
	ReplicaInterval time.Duration
	// HotBlocks is the number of most requested blocks whose mean
	// replicas a sample reports (ReplicaSample.HotMean); zero:
	// DefaultHotBlocks.
	HotBlocks int
}

// ErrInvalid is wrapped by the errors of Validate.
var ErrInvalid = errors.New("sim: invalid")

// Validate reports the first field out of range, by name.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w Config.%s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Prefill < 0:
		return bad("Prefill", "negative %d", c.Prefill)
	case c.Decode < 0:
		return bad("Decode", "negative %d", c.Decode)
	case c.ChunkTokens < 0:
		return bad("ChunkTokens", "negative %d", c.ChunkTokens)
	case c.StoreTokens < 0:
		return bad("StoreTokens", "negative %d", c.StoreTokens)
	case c.RateScale < 0 || math.IsNaN(c.RateScale) || math.IsInf(c.RateScale, 0):
		return bad("RateScale", "%g is not a positive factor", c.RateScale)
	case c.OutputTokens < 0:
		return bad("OutputTokens", "negative %d", c.OutputTokens)
	case c.MaxRequests < 0:
		return bad("MaxRequests", "negative %d", c.MaxRequests)
	case c.HotBlocks < 0:
		return bad("HotBlocks", "negative %d", c.HotBlocks)
	}
	// The scheduler's own fields: its error names them, and is also ours.
	if err := c.scheduler().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.Prefill = cmp.Or(c.Prefill, DefaultPrefill)
	c.Decode = cmp.Or(c.Decode, DefaultDecode)
	c.LocalTokens = cmp.Or(c.LocalTokens, DefaultLocalTokens)
	c.RateScale = cmp.Or(c.RateScale, 1)
	c.TTFTSLO = cmp.Or(c.TTFTSLO, conductor.DefaultTTFTSLO)
	c.TBTSLO = cmp.Or(c.TBTSLO, conductor.DefaultTBTSLO)
	c.ReplicaInterval = cmp.Or(c.ReplicaInterval, DefaultReplicaInterval)
	c.HotBlocks = cmp.Or(c.HotBlocks, DefaultHotBlocks)
	return c
}

// scheduler is the conductor configuration of the disaggregated runs,
// its defaults filled in by conductor.New.
func (c Config) scheduler() conductor.Config {
	return conductor.Config{
		Policy:        c.Policy,
		Admission:     c.Admission,
		TTFTSLO:       c.TTFTSLO,
		TBTSLO:        c.TBTSLO,
		Prefill:       c.PrefillModel,
		Decode:        c.DecodeModel,
		Bandwidth:     c.Bandwidth,
		BalanceBlocks: c.BalanceBlocks,
		StoreBlocks:   blocksOf(c.StoreTokens),
		Seed:          c.Seed,
	}
}

// Name is the run's name in reports and file names: the policy, with
// "+reject" or "+naive-reject" under early rejection; or "coupled" for the
// baseline, with "+prefix-cache" when its instances cache prefixes and
// "+chunked" with chunked prefill.
func (c Config) Name() string {
	c = c.withDefaults()
	if c.Coupled {
		name := "coupled"
		if c.LocalTokens > 0 {
			name += "+prefix-cache"
		}
		if c.ChunkTokens > 0 {
			name += "+chunked"
		}
		return name
	}
	switch c.Admission {
	case conductor.RejectPredicted:
		return c.Policy.String() + "+reject"
	case conductor.RejectCurrentLoad:
		return c.Policy.String() + "+naive-reject"
	}
	return c.Policy.String()
}

// blocksOf is a capacity in tokens as whole blocks; zero or less: 0.
func blocksOf(tokens int64) int {
	if tokens <= 0 {
		return 0
	}
	return int(max(tokens/conductor.BlockTokens, 1))
}

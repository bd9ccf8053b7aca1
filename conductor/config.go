package conductor

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Policy is how the scheduler picks a prefill instance; every policy picks
// the decode instance with the least predicted time between tokens.
type Policy uint8

// Prefill policies, from the paper's §4 (Fig. 5).
const (
	// GlobalCacheAware is Mooncake's Algorithm 1: per instance, its own
	// prefix or, when the best prefix anywhere (another instance, the
	// store) is longer by more than Config.BalanceBlocks, that prefix
	// pulled at Config.Bandwidth; plus its queue; plus the predicted
	// prefill. The least predicted TTFT wins, and a pull replicates the
	// blocks on the chosen instance.
	GlobalCacheAware Policy = iota
	// LocalCacheAware is §4.1 without cache load balancing: an instance
	// reuses only its own prefix; the least predicted TTFT wins.
	LocalCacheAware
	// LoadBalance picks the instance with the least queued prefill work;
	// it reuses whatever prefix that instance happens to hold.
	LoadBalance
	// Random picks an instance at random (Config.Seed); it too reuses
	// whatever prefix that instance happens to hold.
	Random
)

var policyNames = []string{"global-cache-aware", "local-cache-aware", "load-balance", "random"}

// String is the policy's name in flags and reports.
func (p Policy) String() string { return enumString(p, policyNames, "Policy") }

// Policies lists every policy, Mooncake's first.
func Policies() []Policy { return []Policy{GlobalCacheAware, LocalCacheAware, LoadBalance, Random} }

// ParsePolicy reads a policy name, as String writes it.
func ParsePolicy(s string) (Policy, error) { return parseEnum[Policy](s, policyNames, "policy") }

// Admission is the scheduler's admission control.
type Admission uint8

// Admission controls.
const (
	// RejectPredicted is Mooncake's prediction-based early rejection:
	// reject when the predicted TTFT breaks its SLO, or when the TBT
	// predicted for the decode instance at the time the request will reach
	// it (requests then finished gone, requests then arrived from prefill
	// counted) breaks its SLO.
	RejectPredicted Admission = iota
	// RejectCurrentLoad is the naive early rejection it improves on: the
	// same TTFT test, but the TBT is that of the decode instance's current
	// batch plus this request, blind to what prefill is about to deliver
	// and to what will have finished.
	RejectCurrentLoad
	// RejectNone admits everything.
	RejectNone
)

var admissionNames = []string{"predicted", "current-load", "none"}

// String is the admission control's name in flags and reports.
func (a Admission) String() string { return enumString(a, admissionNames, "Admission") }

// ParseAdmission reads an admission control's name, as String writes it.
func ParseAdmission(s string) (Admission, error) {
	return parseEnum[Admission](s, admissionNames, "admission")
}

// enumString is names[v], or typ(v) for a value without a name.
func enumString[T ~uint8](v T, names []string, typ string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, uint8(v))
}

// parseEnum reads one of names, in any case, as its index.
func parseEnum[T ~uint8](s string, names []string, what string) (T, error) {
	for i, n := range names {
		if strings.EqualFold(s, n) {
			return T(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %s %q (want one of %s)", ErrInvalid, what, s, strings.Join(names, ", "))
}

// Defaults of Config's zero fields.
const (
	// DefaultTTFTSLO is the paper's TTFT threshold (§5.1).
	DefaultTTFTSLO = 30 * time.Second
	// DefaultTBTSLO is the paper's tightest TBT threshold (§5.1).
	DefaultTBTSLO = 100 * time.Millisecond
	// DefaultOutput is the output length assumed for a request that does
	// not say (no max_tokens).
	DefaultOutput = 512
)

// Config configures a Scheduler. The zero value is Mooncake's scheduler
// for LLaMA3-70B on 8xA800 nodes with prediction-based early rejection.
type Config struct {
	// Policy picks prefill instances; zero: GlobalCacheAware.
	Policy Policy
	// Admission is the early rejection; zero: RejectPredicted.
	Admission Admission
	// TTFTSLO and TBTSLO are the latency objectives admission checks;
	// zero: DefaultTTFTSLO, DefaultTBTSLO.
	TTFTSLO, TBTSLO time.Duration
	// Prefill predicts prefill execution; zero: DefaultPrefill.
	Prefill PrefillModel
	// Decode predicts decode iterations; zero: DefaultDecode.
	Decode DecodeModel
	// BlockTokens is the tokens per block of Request.Blocks: the engines'
	// block size when the blocks are their hashes (conductor/blockhash).
	// Zero: BlockTokens (512, the traces').
	BlockTokens int
	// BlockBytes is the KV cache of one block, for transfer times; zero:
	// DefaultBlockBytes.
	BlockBytes int64
	// Bandwidth is what a prefill instance pulls KV cache at, bytes per
	// second; zero: DefaultBandwidth.
	Bandwidth float64
	// BalanceBlocks is Algorithm 1's kvcache_balancing_threshold: an
	// instance pulls the best prefix held elsewhere only when it is longer
	// than its own by more than this many blocks. Zero: any longer prefix
	// is pulled, which the bandwidth model makes the right call whenever
	// pulling a block is faster than recomputing it.
	BalanceBlocks int
	// StoreBlocks bounds the store's blocks in the index (LRU); zero:
	// unbounded, the store's own evictions (StoreEvicted) bound it.
	StoreBlocks int
	// DefaultOutput is the output length of a Request with Output zero;
	// zero: DefaultOutput.
	DefaultOutput int
	// Seed seeds the Random policy.
	Seed uint64
}

// ErrInvalid is wrapped by the errors of Validate and of malformed
// arguments.
var ErrInvalid = errors.New("conductor: invalid")

// Validate reports the first field that is out of range, by name.
func (c Config) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w Config.%s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
	}
	switch {
	case int(c.Policy) >= len(policyNames):
		return bad("Policy", "unknown policy %d", c.Policy)
	case int(c.Admission) >= len(admissionNames):
		return bad("Admission", "unknown admission %d", c.Admission)
	case c.TTFTSLO < 0:
		return bad("TTFTSLO", "negative %v", c.TTFTSLO)
	case c.TBTSLO < 0:
		return bad("TBTSLO", "negative %v", c.TBTSLO)
	case c.BlockTokens < 0:
		return bad("BlockTokens", "negative %d", c.BlockTokens)
	case c.BlockBytes < 0:
		return bad("BlockBytes", "negative %d", c.BlockBytes)
	case c.Bandwidth < 0 || math.IsNaN(c.Bandwidth) || math.IsInf(c.Bandwidth, 0):
		return bad("Bandwidth", "%g is not a positive rate", c.Bandwidth)
	case c.BalanceBlocks < 0:
		return bad("BalanceBlocks", "negative %d", c.BalanceBlocks)
	case c.StoreBlocks < 0:
		return bad("StoreBlocks", "negative %d", c.StoreBlocks)
	case c.DefaultOutput < 0:
		return bad("DefaultOutput", "negative %d", c.DefaultOutput)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"Prefill.Base", c.Prefill.Base}, {"Prefill.Linear", c.Prefill.Linear},
		{"Prefill.Quadratic", c.Prefill.Quadratic}, {"Decode.Base", c.Decode.Base},
		{"Decode.Weights", c.Decode.Weights}, {"Decode.PerSeq", c.Decode.PerSeq},
		{"Decode.PerKVToken", c.Decode.PerKVToken},
	} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return bad(f.name, "%g is not a finite, non-negative number of seconds", f.v)
		}
	}
	if c.Decode.KVTokens < 0 {
		return bad("Decode.KVTokens", "negative %d", c.Decode.KVTokens)
	}
	return nil
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	c.TTFTSLO = cmp.Or(c.TTFTSLO, DefaultTTFTSLO)
	c.TBTSLO = cmp.Or(c.TBTSLO, DefaultTBTSLO)
	c.Prefill = cmp.Or(c.Prefill, DefaultPrefill)
	c.Decode = cmp.Or(c.Decode, DefaultDecode)
	c.BlockTokens = cmp.Or(c.BlockTokens, BlockTokens)
	c.BlockBytes = cmp.Or(c.BlockBytes, DefaultBlockBytes)
	c.Bandwidth = cmp.Or(c.Bandwidth, DefaultBandwidth)
	c.DefaultOutput = cmp.Or(c.DefaultOutput, DefaultOutput)
	return c
}

// TransferTime is the time to pull n blocks at the configured bandwidth.
func (c Config) TransferTime(n int) time.Duration {
	return c.withDefaults().transferTime(n)
}

// transferTime is TransferTime on a configuration with its defaults in.
func (c Config) transferTime(n int) time.Duration {
	return seconds(float64(n) * float64(c.BlockBytes) / c.Bandwidth)
}

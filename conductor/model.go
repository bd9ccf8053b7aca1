package conductor

import (
	"math"
	"time"
)

// The default time models are derived from first principles for one
// instance of LLaMA3-70B on a node of 8 NVIDIA A800-SXM4-80GB GPUs
// (tensor parallel 8), the paper's setup, with round efficiency figures
// stated here rather than fitted to any measurement. docs/sim.md walks
// through the arithmetic.
//
// Model (paper Table 1): l = 80 layers, d = 8192, GQA 8 (1024 KV dims),
// a = 4, b = 22 in flops(n) = l(a n^2 d + b n d^2), 70.6e9 parameters
// (141.2 GB in BF16), KV cache 2 x 80 x 1024 x 2 B = 327,680 B per token.
// Node: G = 8 x 312 TFLOPS (BF16 dense), HBM 8 x 2.039 TB/s and 8 x 80 GB,
// host-to-device 128 GB/s, NICs 4 x 200 Gbps = 100 GB/s.
// Efficiencies: prefill reaches half of G (large GEMMs at about 70% of
// peak, less the tensor-parallel all-reduces that do not overlap);
// streaming from HBM reaches 80% of its bandwidth.
const (
	llamaLayers      = 80
	llamaDim         = 8192
	llamaA, llamaB   = 4, 22
	llamaParams      = 70.6e9
	llamaKVBytes     = 2 * llamaLayers * (llamaDim / 8) * 2 // per token
	a800NodeFLOPS    = 8 * 312e12
	a800NodeHBM      = 8 * 2.039e12 // bytes/s
	a800NodeHBMBytes = 8 * 80e9
	prefillMFU       = 0.5
	hbmEfficiency    = 0.8
	// weightRead is one pass over the weights, which every forward pass,
	// prefill or decode, pays at least once.
	weightRead = 2 * llamaParams / (hbmEfficiency * a800NodeHBM)
)

// PrefillModel predicts a prefill's execution time, in seconds, from the
// prompt length n and the reused prefix p, in tokens: the polynomial
//
//	Base + Linear (n - p) + Quadratic (n^2 - p^2)
//
// The linear term is the projections and MLP of the new tokens, the
// quadratic one their attention over the whole prompt; reused tokens cost
// nothing but the load of their KV cache, which the scheduler counts as a
// transfer when it comes from elsewhere.
type PrefillModel struct {
	// Base is the fixed cost of a forward pass (seconds).
	Base float64
	// Linear is the cost per new token (seconds).
	Linear float64
	// Quadratic is the cost per unit of n^2 - p^2 (seconds).
	Quadratic float64
}

// DefaultPrefill is the prefill model of LLaMA3-70B on 8xA800 (see the
// constants above): Base is one read of the weights (10.8 ms), Linear is
// l b d^2 / (G/2) = 94.6 us per token, Quadratic l a d / (G/2) = 2.10 ns.
// A 12k-token prompt takes about 1.45 s, a 128Ki-token one about 48 s.
var DefaultPrefill = PrefillModel{
	Base:      weightRead,
	Linear:    llamaLayers * llamaB * llamaDim * llamaDim / (prefillMFU * a800NodeFLOPS),
	Quadratic: llamaLayers * llamaA * llamaDim / (prefillMFU * a800NodeFLOPS),
}

// Time is the predicted prefill time of n tokens reusing a prefix of p.
func (m PrefillModel) Time(n, p int) time.Duration {
	p = min(max(p, 0), n)
	fn, fp := float64(n), float64(p)
	return seconds(m.Base + m.Linear*(fn-fp) + m.Quadratic*(fn*fn-fp*fp))
}

// DecodeModel predicts one iteration of continuous batching, which is the
// time between tokens of every request in the batch, from the batch size
// B and the tokens K in the batch's KV caches, in seconds:
//
//	Base + max(Weights, B PerSeq) + K PerKVToken
//
// An iteration streams the weights once and every request's KV cache once
// (memory-bound), while the GEMMs grow with the batch (compute-bound
// beyond the roofline's knee); the two overlap, hence the max.
type DecodeModel struct {
	// Base is the fixed cost of an iteration besides the weights:
	// tensor-parallel all-reduces and launches (seconds).
	Base float64
	// Weights is reading the weights from HBM (seconds).
	Weights float64
	// PerSeq is the GEMM compute per request in the batch (seconds).
	PerSeq float64
	// PerKVToken is reading one token's KV cache (seconds).
	PerKVToken float64
	// KVTokens is the KV cache capacity of a decode instance, in tokens:
	// HBM left for the cache. Zero: unbounded.
	KVTokens int
}

// DefaultDecode is the decode model of LLaMA3-70B on 8xA800: Weights is
// 141.2 GB at 80% of 16.3 TB/s (10.8 ms); Base is 160 all-reduces (two per
// layer) of about 10 us each (1.6 ms); PerSeq is 2 x 70.6e9 FLOPs at half
// of G (113 us); PerKVToken is 320 KiB at 80% of the HBM bandwidth
// (25.1 ns); KVTokens is 90% of 640 GB less the weights, in 320 KiB tokens
// (1.33M). A batch of 50 requests of 12k tokens: about 28 ms.
var DefaultDecode = DecodeModel{
	Base:       160 * 10e-6,
	Weights:    weightRead,
	PerSeq:     2 * llamaParams / (prefillMFU * a800NodeFLOPS),
	PerKVToken: llamaKVBytes / (hbmEfficiency * a800NodeHBM),
	KVTokens:   int(math.Floor((0.9*a800NodeHBMBytes - 2*llamaParams) / llamaKVBytes)),
}

// TBT is the predicted iteration time of a batch of b requests holding k
// tokens of KV cache; an empty batch takes no time.
func (m DecodeModel) TBT(b, k int) time.Duration {
	if b <= 0 {
		return 0
	}
	return seconds(m.Base + max(m.Weights, float64(b)*m.PerSeq) + float64(k)*m.PerKVToken)
}

// DefaultBlockBytes is the KV cache of one 512-token block of LLaMA3-70B
// in BF16: 512 x 327,680 B = 160 MiB.
const DefaultBlockBytes = BlockTokens * llamaKVBytes

// DefaultBandwidth is the bandwidth a prefill instance pulls KV cache at,
// in bytes per second: the lesser of the node's NICs (4 x 200 Gbps) and
// its host-to-device path (128 GB/s), as in the paper's §2.2.
const DefaultBandwidth = 100e9

func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/1e9 {
		return math.MaxInt64
	}
	return time.Duration(math.Round(s * 1e9))
}

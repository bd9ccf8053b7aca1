package sim

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/mooncake-go/mooncake/internal/hist"
)

// Summary is a replay in the numbers the paper reports; its JSON is what
// `mooncake sim --json` prints.
type Summary struct {
	// Policy is the run's name (Config.Name).
	Policy string `json:"policy"`
	// Requests is the number of requests replayed; Rejected of them were
	// turned away by admission control.
	Requests int `json:"requests"`
	Rejected int `json:"rejected"`
	// CacheHitRatio is the prompt tokens reused from a cache over the
	// prompt tokens, of the requests admitted.
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	// TTFTMeanS and TTFTP90S are the mean and 90th percentile of the TTFT
	// of the requests admitted, in seconds.
	TTFTMeanS float64 `json:"ttft_mean_s"`
	TTFTP90S  float64 `json:"ttft_p90_s"`
	// TBTP90MS is the 90th percentile of the requests' TBT (the paper's
	// per-request metric), over admitted requests with more than one
	// output token, in milliseconds.
	TBTP90MS float64 `json:"tbt_p90_ms"`
	// EffectiveRequestRatio is the share of all requests that were
	// admitted and met both SLOs (§5.1).
	EffectiveRequestRatio float64 `json:"effective_request_ratio"`
	// PrefillTimeMeanS is the mean prefill GPU time of the admitted
	// requests, in seconds (Fig. 10).
	PrefillTimeMeanS float64 `json:"prefill_time_mean_s"`
	// TTFTSLOS and TBTSLOMS are the objectives the ratio counts.
	TTFTSLOS float64 `json:"ttft_slo_s"`
	TBTSLOMS float64 `json:"tbt_slo_ms"`
	// SimulatedS is the simulated time until the last request finished.
	SimulatedS float64 `json:"simulated_s"`
	// ReplicasMax is the most prefill instances that held one block at
	// any replica sample (Result.ReplicasMax); HotBlockReplicasMean the
	// mean replicas of the hot blocks, averaged over the samples
	// (Result.HotReplicasMean).
	// Both 0 for the coupled baseline.
	ReplicasMax          int     `json:"replicas_max"`
	HotBlockReplicasMean float64 `json:"hot_block_replicas_mean"`
}

// Summary condenses the outcomes.
func (r *Result) Summary() Summary {
	ttftSLO, tbtSLO := r.Config.TTFTSLO, r.Config.TBTSLO
	s := Summary{Policy: r.Config.Name(), Requests: len(r.Outcomes), TTFTSLOS: ttftSLO.Seconds(),
		TBTSLOMS: float64(tbtSLO) / 1e6, ReplicasMax: r.ReplicasMax(), HotBlockReplicasMean: r.HotReplicasMean()}
	var ttft, tbt []float64
	var hit, in, prefill float64
	for _, o := range r.Outcomes {
		s.SimulatedS = max(s.SimulatedS, o.Finish.Seconds())
		if o.Rejected {
			s.Rejected++
			continue
		}
		ttft = append(ttft, o.TTFT.Seconds())
		if o.OutputTokens > 1 {
			tbt = append(tbt, float64(o.TBT)/1e6)
		}
		hit += float64(o.HitTokens)
		in += float64(o.InputTokens)
		prefill += o.PrefillTime.Seconds()
	}
	if in > 0 {
		s.CacheHitRatio = hit / in
	}
	if n := len(ttft); n > 0 {
		s.TTFTMeanS = mean(ttft)
		s.PrefillTimeMeanS = prefill / float64(n)
	}
	s.TTFTP90S = hist.NearestRank(ttft, 0.9)
	s.TBTP90MS = hist.NearestRank(tbt, 0.9)
	s.EffectiveRequestRatio = r.Effective(ttftSLO, tbtSLO)
	return s
}

// Effective is the share of all requests admitted with a TTFT within
// ttft and a TBT within tbt.
func (r *Result) Effective(ttft, tbt time.Duration) float64 {
	if len(r.Outcomes) == 0 {
		return 0
	}
	n := 0
	for _, o := range r.Outcomes {
		if !o.Rejected && o.TTFT <= ttft && o.TBT <= tbt {
			n++
		}
	}
	return float64(n) / float64(len(r.Outcomes))
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// WriteTable prints summaries as an aligned table, one run per row.
func WriteTable(w io.Writer, ss []Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\trequests\trejected\thit ratio\tTTFT mean (s)\tTTFT p90 (s)\tTBT p90 (ms)\tprefill GPU (s)\teffective\t")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%.2f\t%.2f\t%.1f\t%.3f\t%.1f%%\t\n", s.Policy, s.Requests, s.Rejected,
			100*s.CacheHitRatio, s.TTFTMeanS, s.TTFTP90S, s.TBTP90MS, s.PrefillTimeMeanS, 100*s.EffectiveRequestRatio)
	}
	return tw.Flush()
}

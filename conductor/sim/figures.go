package sim

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// Fig5 replays the trace once per prefill policy (the paper's Fig. 5),
// Mooncake's global-cache-aware first, on base's deployment; base.Policy
// and base.Coupled are overridden. The paper compares the TTFT of every
// request, so the figure's command sets base.Admission to RejectNone.
func Fig5(reqs []trace.Request, base Config) ([]*Result, error) {
	var out []*Result
	for _, p := range conductor.Policies() {
		cfg := base
		cfg.Policy, cfg.Coupled = p, false
		r, err := Run(cfg, reqs)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", p, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// HitCurve is the paper's Fig. 9: the prefix-cache hit ratio of the trace
// through one LRU cache of each capacity, in request order, with no
// timing, no instances and no replicas.
type HitCurve struct {
	// Capacities are the cache sizes in tokens; Ratios[i] is the hit
	// ratio (prompt tokens reused over prompt tokens) at Capacities[i].
	Capacities []int64
	Ratios     []float64
	// Infinite is the ratio of an unbounded cache: the bound.
	Infinite float64
}

// Fig9Capacities are the capacities of Fig. 9: half decades from 1e4 to
// 1e9 tokens.
func Fig9Capacities() []int64 {
	var out []int64
	for e := 8; e <= 18; e++ {
		out = append(out, int64(math.Round(math.Pow(10, float64(e)/2))))
	}
	return out
}

// Fig9 computes the hit ratio curve over capacities (in tokens).
func Fig9(reqs []trace.Request, capacities []int64) HitCurve {
	c := HitCurve{Capacities: capacities, Infinite: hitRatio(reqs, 0)}
	for _, capTokens := range capacities {
		c.Ratios = append(c.Ratios, hitRatio(reqs, max(blocksOf(capTokens), 1)))
	}
	return c
}

// At is the hit ratio at a capacity of tokens, interpolated in log
// capacity between the two measured around it.
func (c HitCurve) At(tokens int64) float64 {
	for i := 1; i < len(c.Capacities); i++ {
		if c.Capacities[i] >= tokens {
			lo, hi := math.Log(float64(c.Capacities[i-1])), math.Log(float64(c.Capacities[i]))
			f := (math.Log(float64(tokens)) - lo) / (hi - lo)
			return c.Ratios[i-1] + f*(c.Ratios[i]-c.Ratios[i-1])
		}
	}
	return c.Ratios[len(c.Ratios)-1]
}

// hitRatio replays the trace's blocks through one LRU of capacity blocks
// (0: unbounded).
func hitRatio(reqs []trace.Request, capacity int) float64 {
	c := newLRU(capacity)
	var hit, in float64
	blocks := make([]uint64, 0, 256)
	for _, r := range reqs {
		blocks = blocks[:0]
		for _, h := range r.HashIDs {
			blocks = append(blocks, uint64(h))
		}
		hit += float64(min(int64(c.prefix(blocks))*conductor.BlockTokens, r.InputLength))
		in += float64(r.InputLength)
		c.insert(blocks, nil)
	}
	if in == 0 {
		return 0
	}
	return hit / in
}

// Fig10 is the paper's Fig. 10 on the conversation trace: 10 prefill
// instances with a local cache of 3M tokens each, every output cut to one
// token to isolate prefill, nothing rejected; the local-cache run reuses
// only an instance's own cache (LocalCacheAware), the global one pulls
// from the others' (GlobalCacheAware). base supplies the rest (rate,
// models, seed).
func Fig10(reqs []trace.Request, base Config) (local, global *Result, err error) {
	base.Prefill, base.LocalTokens, base.OutputTokens = 10, DefaultLocalTokens, 1
	base.Admission, base.Coupled = conductor.RejectNone, false
	base.Policy = conductor.LocalCacheAware
	if local, err = Run(base, reqs); err != nil {
		return nil, nil, err
	}
	base.Policy = conductor.GlobalCacheAware
	if global, err = Run(base, reqs); err != nil {
		return nil, nil, err
	}
	return local, global, nil
}

// Fig1Systems are the deployments of Fig. 1 on base's nodes: Mooncake
// (global-cache-aware with prediction-based early rejection) on
// base.Prefill + base.Decode disaggregated instances, and the coupled
// baseline on as many nodes, as vLLM runs: without prefix caching, with
// prefix caching in the HBM the KV cache has (DecodeModel.KVTokens), and
// with chunked prefill at vLLM's default budget of 512 tokens.
func Fig1Systems(base Config) []Config {
	moon := base
	moon.Policy, moon.Admission, moon.Coupled = conductor.GlobalCacheAware, conductor.RejectPredicted, false
	plain := base
	plain.Coupled, plain.LocalTokens, plain.ChunkTokens = true, -1, 0
	cached := plain
	kv := base.DecodeModel.KVTokens
	if kv == 0 {
		kv = conductor.DefaultDecode.KVTokens
	}
	cached.LocalTokens = int64(kv)
	chunked := plain
	chunked.ChunkTokens = 512
	return []Config{moon, plain, cached, chunked}
}

// Fig1Names are the names Fig. 1 gives Fig1Systems.
var Fig1Names = []string{"Mooncake", "coupled (vLLM)", "coupled + prefix caching", "coupled + chunked prefill"}

// Fig1Thresholds are the TBT thresholds of Fig. 1's X axis.
func Fig1Thresholds() []time.Duration {
	var out []time.Duration
	for ms := 100; ms <= 1000; ms += 50 {
		out = append(out, time.Duration(ms)*time.Millisecond)
	}
	return out
}

// Fig1 replays the trace on every system of Fig1Systems.
func Fig1(reqs []trace.Request, base Config) ([]*Result, error) {
	var out []*Result
	for i, cfg := range Fig1Systems(base) {
		r, err := Run(cfg, reqs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", Fig1Names[i], err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Capacity is Fig. 1 as the paper measures it: each system's effective
// request ratio over a sweep of loads, from which its capacity at a TBT
// threshold is the highest load it sustains with a target share of
// effective requests.
type Capacity struct {
	// Rates are the loads swept (Config.RateScale), increasing.
	Rates []float64
	// Thresholds are the TBT thresholds.
	Thresholds []time.Duration
	// Ratios[s][r][t] is system s's effective request ratio at Rates[r]
	// and Thresholds[t].
	Ratios [][][]float64
}

// At is system s's capacity at threshold t: the highest rate of the sweep
// up to which (every lower rate included) at least target of the requests
// were effective; 0 when even the lowest rate falls short.
func (c Capacity) At(s, t int, target float64) float64 {
	best := 0.0
	for r, rate := range c.Rates {
		if c.Ratios[s][r][t] < target {
			break
		}
		best = rate
	}
	return best
}

// Fig1Capacity replays the trace on every system of Fig1Systems at every
// rate, at most workers replays at a time (they are independent).
func Fig1Capacity(reqs []trace.Request, base Config, rates []float64, thresholds []time.Duration,
	workers int) (Capacity, error) {
	systems := Fig1Systems(base)
	c := Capacity{Rates: rates, Thresholds: thresholds, Ratios: make([][][]float64, len(systems))}
	type job struct{ s, r int }
	jobs := make(chan job)
	errs := make(chan error, len(systems)*len(rates))
	for s := range systems {
		c.Ratios[s] = make([][]float64, len(rates))
	}
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				cfg := systems[j.s]
				cfg.RateScale = rates[j.r]
				res, err := Run(cfg, reqs)
				if err != nil {
					errs <- fmt.Errorf("%s at rate %g: %w", Fig1Names[j.s], rates[j.r], err)
					continue
				}
				row := make([]float64, len(thresholds))
				for t, th := range thresholds {
					row[t] = res.Effective(res.Config.TTFTSLO, th)
				}
				c.Ratios[j.s][j.r] = row // each job owns its cell
			}
		}()
	}
	for s := range systems {
		for r := range rates {
			jobs <- job{s, r}
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Capacity{}, err
	}
	return c, nil
}

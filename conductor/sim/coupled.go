package sim

import (
	"strconv"
	"time"

	"github.com/mooncake-go/mooncake/conductor"
)

// coupledNode is an instance of the coupled baseline, as vLLM runs without
// disaggregation: one continuous batch per instance in which prefills and
// decodes take turns. Without chunking, a waiting prompt's whole prefill
// runs as one iteration, before any decode iteration (vLLM's scheduler
// favours prefills), so every request decoding there waits for it; with
// chunking, every iteration carries the decode tokens and a chunk of the
// oldest waiting prompt, which stretches each iteration instead.
type coupledNode struct {
	id          string
	cache       *lru // nil: no prefix caching
	waiting     []int
	decodeBatch // its mem also reserves the prompt in prefill

	// The iteration in progress.
	running  bool
	decoding bool // the batch gets a token
	prefill  int  // request whose prompt (or chunk of it) runs; -1: none
	chunk    int  // tokens of that prompt computed by this iteration
}

// runCoupled replays the trace on Prefill+Decode coupled instances; a
// request goes to the instance with the fewest unfinished requests, the
// load balancing §4.1 ascribes to previous systems. Nothing is rejected.
func (s *state) runCoupled() error {
	cfg := s.cfg
	sc := cfg.scheduler()
	// conductor fills the model defaults; a throwaway scheduler does it.
	if sched, err := conductor.New(sc); err == nil {
		sc = sched.Config()
	} else {
		return err
	}
	local := blocksOf(cfg.LocalTokens)
	nodes := make([]*coupledNode, cfg.Prefill+cfg.Decode)
	for i := range nodes {
		nodes[i] = &coupledNode{id: "c" + strconv.Itoa(i), prefill: -1}
		if local > 0 {
			nodes[i].cache = newLRU(local)
		}
	}

	// prefilled ends request r's prefill on n at now: its first token, its
	// blocks cached, and it joins the batch (or finishes).
	prefilled := func(n *coupledNode, ri int) {
		r := &s.reqs[ri]
		r.TTFT, r.lastToken = s.now-r.Arrival, s.now
		if n.cache != nil {
			n.cache.insert(r.blocks, nil)
		}
		n.waiting = n.waiting[1:]
		if r.decodeTokens() == 0 {
			n.mem -= r.InputTokens + r.OutputTokens
			r.Finish, r.done = s.now, true
			return
		}
		n.batch = append(n.batch, ri)
		n.kv += r.InputTokens
	}

	// begin makes the head of n's waiting queue the prompt in prefill,
	// once its cache fits: its reused prefix is what n's cache has now.
	begin := func(n *coupledNode) bool {
		if len(n.waiting) == 0 {
			return false
		}
		r := &s.reqs[n.waiting[0]]
		if n.prefill == n.waiting[0] {
			return true
		}
		need := r.InputTokens + r.OutputTokens
		if kv := sc.Decode.KVTokens; kv > 0 && n.mem+need > kv && n.mem > 0 {
			return false
		}
		n.mem += need
		if n.cache != nil {
			r.HitTokens = min(n.cache.prefix(r.blocks)*conductor.BlockTokens, max(r.InputTokens-1, 0))
		}
		r.chunked = r.HitTokens
		n.prefill = n.waiting[0]
		return true
	}

	// next starts n's next iteration, if it has work.
	next := func(ni int) {
		n := nodes[ni]
		n.running, n.decoding, n.chunk = false, false, 0
		pm := sc.Prefill
		var dur, compute time.Duration
		switch {
		case cfg.ChunkTokens == 0 && begin(n):
			r := &s.reqs[n.prefill]
			compute = pm.Time(r.InputTokens, r.HitTokens)
			n.chunk, dur = r.InputTokens-r.chunked, compute
		case cfg.ChunkTokens > 0:
			n.decoding = len(n.batch) > 0
			if n.decoding {
				dur = sc.Decode.TBT(len(n.batch), n.kv)
			}
			if budget := cfg.ChunkTokens - len(n.batch); budget > 0 && begin(n) {
				r := &s.reqs[n.prefill]
				n.chunk = min(budget, r.InputTokens-r.chunked)
				done, c := float64(r.chunked), float64(n.chunk)
				sec := pm.Linear*c + pm.Quadratic*((done+c)*(done+c)-done*done)
				if !n.decoding {
					sec += pm.Base // the pass over the weights the decode would have paid
				}
				compute = seconds(sec)
				dur += compute
			}
		default:
			n.decoding = len(n.batch) > 0
			if n.decoding {
				dur = sc.Decode.TBT(len(n.batch), n.kv)
			}
		}
		if n.prefill >= 0 {
			s.reqs[n.prefill].PrefillTime += compute
		}
		if n.decoding || n.prefill >= 0 {
			n.running = true
			s.push(s.now+dur, iterationEnd, ni, -1)
		}
	}

	arrive := func(i int) error {
		r := &s.reqs[i]
		best := 0
		for j, n := range nodes {
			if len(n.waiting)+len(n.batch) < len(nodes[best].waiting)+len(nodes[best].batch) {
				best = j
			}
		}
		n := nodes[best]
		r.Prefill, r.Decode = n.id, n.id
		n.waiting = append(n.waiting, i)
		if !n.running {
			next(best)
		}
		return nil
	}

	handle := func(e event) error {
		n := nodes[e.inst]
		if n.decoding {
			n.token(s.reqs, s.now, nil)
		}
		if ri := n.prefill; ri >= 0 {
			r := &s.reqs[ri]
			if r.chunked += n.chunk; r.chunked >= r.InputTokens {
				n.prefill = -1
				prefilled(n, ri)
			}
		}
		next(e.inst)
		return nil
	}
	return s.loop(arrive, handle)
}

func seconds(s float64) time.Duration { return time.Duration(s * 1e9) }

package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// streamLayers is the number of layers of LLaMA3-70B: a prefill streams
// each layer's KV cache to the decode instance as soon as the layer is
// done (§3.1, step 3), so what is left to send when the prefill ends is
// one layer's share.
const streamLayers = 80

// ErrOrder is wrapped by the error of Run on a trace whose timestamps
// decrease.
var ErrOrder = errors.New("sim: timestamps must not decrease")

// Outcome is what happened to one request of the trace.
type Outcome struct {
	// Index is the request's line in the trace (from 0).
	Index int
	// Arrival is when it arrived, after rate scaling.
	Arrival time.Duration
	// InputTokens and OutputTokens are its lengths (OutputTokens after
	// Config.OutputTokens, and at least one: the token the prefill makes).
	InputTokens, OutputTokens int
	// Prefill and Decode are the instances that ran it (the same one when
	// coupled); empty when rejected.
	Prefill, Decode string
	// Rejected is set when admission control turned it away; Reason says
	// why ("ttft", "tbt", "kv-memory").
	Rejected bool
	Reason   string
	// HitTokens is the prompt prefix reused from a cache, PulledTokens the
	// part of it transferred from another instance or the store.
	HitTokens, PulledTokens int
	// TTFT is the time from arrival to the first token; TBT the paper's
	// time between tokens (§5.1): the mean of the longest 10% of the
	// intervals between its tokens (zero with one output token).
	TTFT, TBT time.Duration
	// PrefillTime is the GPU time of its prefill (no queueing, no
	// transfer).
	PrefillTime time.Duration
	// Finish is when its last token came out.
	Finish time.Duration
}

// Result is a replay: the configuration, defaults filled in, and every
// request's outcome in trace order.
type Result struct {
	Config   Config
	Outcomes []Outcome
	// Replicas is the replica distribution of the prefix index over
	// time, every Config.ReplicaInterval and at the end; none for the
	// coupled baseline, which has no index, or without sampling.
	Replicas []ReplicaSample
}

// Run replays reqs (in trace order, timestamps non-decreasing) on the
// deployment cfg describes and returns every request's outcome: each is
// either rejected or completed, none is left behind. The disaggregated
// policies are decided by a conductor.Scheduler on the simulated clock;
// execution (queues, transfers, prefill, continuous-batching decode) is
// simulated apart from its predictions, with the same time models.
func Run(cfg Config, reqs []trace.Request) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.MaxRequests > 0 && cfg.MaxRequests < len(reqs) {
		reqs = reqs[:cfg.MaxRequests]
	}
	s := &state{cfg: cfg, reqs: make([]request, len(reqs))}
	for i, r := range reqs {
		out := int(r.OutputLength)
		if cfg.OutputTokens > 0 {
			out = cfg.OutputTokens
		}
		blocks := make([]uint64, len(r.HashIDs))
		for j, h := range r.HashIDs {
			blocks[j] = uint64(h)
		}
		at := math.Round(float64(r.Timestamp) * 1e6 / cfg.RateScale)
		if at >= 1<<62 {
			return nil, fmt.Errorf("sim: request %d of the trace (from 1): timestamp %d ms at rate scale %g is beyond the simulated clock",
				i+1, r.Timestamp, cfg.RateScale)
		}
		s.reqs[i] = request{
			Outcome: Outcome{Index: i, Arrival: time.Duration(at),
				InputTokens: int(r.InputLength), OutputTokens: max(out, 1)},
			blocks: blocks,
		}
		if i > 0 && s.reqs[i].Arrival < s.reqs[i-1].Arrival {
			return nil, fmt.Errorf("%w: request %d of the trace (from 1) arrives at %d ms, before request %d (%d ms)",
				ErrOrder, i+1, r.Timestamp, i, reqs[i-1].Timestamp)
		}
	}
	var err error
	if cfg.Coupled {
		err = s.runCoupled()
	} else {
		err = s.runDisaggregated()
	}
	if err != nil {
		return nil, err
	}
	res := &Result{Config: cfg, Outcomes: make([]Outcome, len(s.reqs)), Replicas: s.replicas}
	for i := range s.reqs {
		r := &s.reqs[i]
		if !r.done {
			return nil, fmt.Errorf("sim: request %d neither completed nor rejected", i)
		}
		r.TBT = r.longest.mean()
		res.Outcomes[i] = r.Outcome
	}
	return res, nil
}

// request is a request in flight: its outcome so far and the simulation's
// bookkeeping.
type request struct {
	Outcome
	blocks    []uint64
	id        string
	dec       conductor.Decision
	lastToken time.Duration // when its latest token came out
	decoded   int           // tokens from decode iterations
	chunked   int           // tokens prefilled so far (chunked prefill)
	longest   topTenth
	done      bool
}

// decodeTokens is the number of tokens decode iterations produce; the
// prefill produces the first.
func (r *request) decodeTokens() int { return r.OutputTokens - 1 }

// state is one replay.
type state struct {
	cfg    Config
	reqs   []request
	events events
	seq    uint64
	now    time.Duration
	// replicas are the replica samples of a disaggregated replay.
	replicas []ReplicaSample
}

// push schedules an event; ties run in the order they were pushed.
func (s *state) push(at time.Duration, kind eventKind, inst, req int) {
	s.seq++
	s.events.push(event{at: at, seq: s.seq, kind: kind, inst: inst, req: req})
}

// loop runs arrivals and events in time order until both are exhausted;
// at equal times, events (completions) run before arrivals.
func (s *state) loop(arrive func(i int) error, handle func(e event) error) error {
	next := 0
	for next < len(s.reqs) || len(s.events) > 0 {
		if len(s.events) > 0 && (next == len(s.reqs) || s.events[0].at <= s.reqs[next].Arrival) {
			e := s.events.pop()
			s.now = e.at
			if err := handle(e); err != nil {
				return err
			}
			continue
		}
		s.now = s.reqs[next].Arrival
		if err := arrive(next); err != nil {
			return err
		}
		next++
	}
	return nil
}

type eventKind uint8

const (
	prefillEnd   eventKind = iota // a prefill instance finished its head
	decodeArrive                  // a request's KV cache reached its decode instance
	iterationEnd                  // a decode (or coupled) instance finished an iteration
)

type event struct {
	at        time.Duration
	seq       uint64
	kind      eventKind
	inst, req int
}

// events is a binary min-heap by (at, seq), typed so that pushing and
// popping the million or so events of a replay allocates nothing.
type events []event

func (q events) less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}

func (q *events) push(e event) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *events) pop() event {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if l+1 < len(h) && h.less(l+1, m) {
			m = l + 1
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// prefillNode is a simulated prefill instance: a FIFO of prefills, the
// head running, and its local cache.
type prefillNode struct {
	id    string
	cache *lru // nil: no local cache
	queue []int
}

// decodeNode is a simulated decode instance running continuous batching:
// requests whose KV cache has arrived wait until an iteration ends and
// their cache fits in HBM, then get a token every iteration.
type decodeNode struct {
	id string
	decodeBatch
	waiting []int
	running bool
}

// decodeBatch is a continuous batch of decoding requests, of a decode or a
// coupled instance.
type decodeBatch struct {
	batch []int
	mem   int // tokens reserved: prompt + output of each request
	kv    int // tokens in the batch's KV caches now
}

// token ends an iteration of the batch at now: every request gets a token,
// and those that have all theirs leave, done at now, each then passed to
// finished (nil: none).
func (b *decodeBatch) token(reqs []request, now time.Duration, finished func(*request)) {
	kept := b.batch[:0]
	for _, ri := range b.batch {
		r := &reqs[ri]
		r.longest.add(now-r.lastToken, r.decodeTokens())
		r.lastToken = now
		r.decoded++
		b.kv++
		if r.decoded < r.decodeTokens() {
			kept = append(kept, ri)
			continue
		}
		b.mem -= r.InputTokens + r.OutputTokens
		b.kv -= r.InputTokens + r.decoded
		r.Finish, r.done = now, true
		if finished != nil {
			finished(r)
		}
	}
	b.batch = kept
}

// runDisaggregated replays the trace on prefill and decode pools that a
// conductor.Scheduler routes.
func (s *state) runDisaggregated() error {
	cfg := s.cfg
	sched, err := conductor.New(cfg.scheduler())
	if err != nil {
		return err
	}
	sc := sched.Config()
	local := blocksOf(cfg.LocalTokens)
	prefill := make([]*prefillNode, cfg.Prefill)
	prefillByID, decodeByID := make(map[string]int), make(map[string]int)
	for i := range prefill {
		p := &prefillNode{id: "p" + strconv.Itoa(i)}
		if local > 0 {
			p.cache = newLRU(local)
		}
		if err := sched.Add(conductor.Instance{ID: p.id, Role: conductor.Prefill, CacheBlocks: local}); err != nil {
			return err
		}
		prefill[i], prefillByID[p.id] = p, i
	}
	decode := make([]*decodeNode, cfg.Decode)
	for i := range decode {
		d := &decodeNode{id: "d" + strconv.Itoa(i)}
		if err := sched.Add(conductor.Instance{ID: d.id, Role: conductor.Decode}); err != nil {
			return err
		}
		decode[i], decodeByID[d.id] = d, i
	}
	var store *lru
	if cfg.StoreTokens > 0 {
		store = newLRU(blocksOf(cfg.StoreTokens))
	}

	// start runs the head of p's queue: pull the prefix the decision
	// planned, as much of it as the source still has, then compute the
	// rest; the instance is busy for both.
	start := func(pi int) {
		p := prefill[pi]
		r := &s.reqs[p.queue[0]]
		own := 0
		if p.cache != nil {
			own = p.cache.prefix(r.blocks)
		}
		reuse, pulled := own, 0
		if r.dec.Pulled > 0 {
			var src *lru
			if r.dec.Source == conductor.StoreHolder {
				src = store
			} else if j, ok := prefillByID[r.dec.Source]; ok {
				src = prefill[j].cache
			}
			if src != nil {
				if have := min(src.prefix(r.blocks), r.dec.Reused); have > own {
					reuse, pulled = have, have-own
				}
			}
		}
		r.HitTokens = min(reuse*conductor.BlockTokens, r.InputTokens)
		r.PulledTokens = min(pulled*conductor.BlockTokens, r.InputTokens)
		r.PrefillTime = sc.Prefill.Time(r.InputTokens, r.HitTokens)
		s.push(s.now+sc.TransferTime(pulled)+r.PrefillTime, prefillEnd, pi, p.queue[0])
	}

	// finish ends a request at now.
	finish := func(r *request) {
		r.Finish, r.done = s.now, true
		sched.DecodeDone(s.now, r.id)
	}

	// iterate ends d's iteration, if one ran, and starts the next.
	iterate := func(di int, ended bool) {
		d := decode[di]
		if ended {
			d.token(s.reqs, s.now, finish)
		}
		d.admit(s.reqs, sc.Decode.KVTokens)
		d.running = len(d.batch) > 0
		if d.running {
			s.push(s.now+sc.Decode.TBT(len(d.batch), d.kv), iterationEnd, di, -1)
		}
	}

	rs := newReplicaSampler(cfg, sched)
	arrive := func(i int) error {
		rs.until(s.now)
		r := &s.reqs[i]
		rs.access(r.blocks)
		r.id = strconv.Itoa(i)
		dec, err := sched.Schedule(s.now, conductor.Request{ID: r.id, Tokens: r.InputTokens,
			Output: r.OutputTokens, Blocks: r.blocks})
		var rej *conductor.RejectError
		switch {
		case errors.As(err, &rej):
			r.Rejected, r.Reason, r.done, r.Finish = true, rej.Reason, true, s.now
			return nil
		case err != nil:
			return fmt.Errorf("sim: request %d: %w", i, err)
		}
		r.dec, r.Prefill, r.Decode = dec, dec.Prefill, dec.Decode
		pi := prefillByID[dec.Prefill]
		p := prefill[pi]
		p.queue = append(p.queue, i)
		if len(p.queue) == 1 {
			start(pi)
		}
		return nil
	}

	handle := func(e event) error {
		rs.until(s.now)
		switch e.kind {
		case prefillEnd:
			p, r := prefill[e.inst], &s.reqs[e.req]
			r.TTFT, r.lastToken = s.now-r.Arrival, s.now
			if p.cache != nil {
				var gone []uint64
				p.cache.insert(r.blocks, func(k uint64) { gone = append(gone, k) })
				sched.BlockStored(p.id, r.blocks)
				if len(gone) > 0 {
					sched.BlockRemoved(p.id, gone)
				}
			}
			if store != nil {
				var gone []uint64
				store.insert(r.blocks, func(k uint64) { gone = append(gone, k) })
				sched.StoreAdded(r.blocks)
				if len(gone) > 0 {
					sched.StoreEvicted(gone)
				}
			}
			p.queue = p.queue[1:]
			if len(p.queue) > 0 {
				start(e.inst)
			}
			if r.decodeTokens() == 0 {
				sched.PrefillDone(s.now, r.id)
				finish(r)
				return nil
			}
			tail := sc.TransferTime((r.InputTokens+conductor.BlockTokens-1)/conductor.BlockTokens) / streamLayers
			s.push(s.now+tail, decodeArrive, decodeByID[r.Decode], e.req)
		case decodeArrive:
			d, r := decode[e.inst], &s.reqs[e.req]
			sched.PrefillDone(s.now, r.id)
			d.waiting = append(d.waiting, e.req)
			if !d.running {
				iterate(e.inst, false)
			}
		case iterationEnd:
			iterate(e.inst, true)
		}
		return nil
	}
	if err := s.loop(arrive, handle); err != nil {
		return err
	}
	rs.end(s.now)
	s.replicas = rs.samples
	return nil
}

// admit moves waiting requests into the batch, in arrival order, while
// their KV caches (prompt and whole output) fit in capacity tokens (zero:
// unbounded); one that fits nowhere still runs alone.
func (d *decodeNode) admit(reqs []request, capacity int) {
	n := 0
	for _, ri := range d.waiting {
		r := &reqs[ri]
		need := r.InputTokens + r.OutputTokens
		if capacity > 0 && d.mem+need > capacity && len(d.batch) > 0 {
			break
		}
		d.batch = append(d.batch, ri)
		d.mem += need
		d.kv += r.InputTokens + r.decoded
		n++
	}
	d.waiting = d.waiting[n:]
}

// topTenth keeps the longest tenth of a request's token intervals, a
// min-heap of at most ceil(n/10) of them, n its number of intervals.
type topTenth []time.Duration

func (t *topTenth) add(v time.Duration, n int) {
	k := (n + 9) / 10
	h := *t
	if len(h) < k {
		h = append(h, v)
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if h[p] <= h[i] {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
		*t = h
		return
	}
	if k == 0 || v <= h[0] {
		return
	}
	h[0] = v
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < len(h) && h[l] < h[m] {
			m = l
		}
		if l+1 < len(h) && h[l+1] < h[m] {
			m = l + 1
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (t topTenth) mean() time.Duration {
	if len(t) == 0 {
		return 0
	}
	var sum time.Duration
	for _, v := range t {
		sum += v
	}
	return sum / time.Duration(len(t))
}

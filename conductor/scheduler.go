package conductor

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Errors of the Scheduler besides ErrRejected and ErrInvalid.
var (
	// ErrDuplicate: an instance ID, holder or in-flight request ID that is
	// already registered.
	ErrDuplicate = errors.New("conductor: already registered")
	// ErrUnknown: Remove of an instance that is not registered.
	ErrUnknown = errors.New("conductor: unknown instance")
	// ErrNoInstance: Schedule with no prefill or no decode instance.
	ErrNoInstance = errors.New("conductor: no instance to schedule on")
)

// RejectError is the error Schedule returns when admission control rejects
// a request; it wraps ErrRejected and says which objective the prediction
// broke.
type RejectError struct {
	// Reason is "ttft", "tbt" or "kv-memory" (no decode instance has room
	// for the request's KV cache).
	Reason string
	// Predicted and SLO are the predicted latency and its objective (zero
	// for kv-memory).
	Predicted, SLO time.Duration
}

func (e *RejectError) Error() string {
	if e.Reason == "kv-memory" {
		return ErrRejected.Error() + ": no decode instance has room for the KV cache"
	}
	what := map[string]string{"ttft": "TTFT", "tbt": "TBT"}[e.Reason]
	return fmt.Sprintf("%v: predicted %s %v exceeds the SLO %v", ErrRejected, what,
		e.Predicted.Round(time.Microsecond), e.SLO)
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *RejectError) Unwrap() error { return ErrRejected }

// KVEventSink receives the KV-cache events an engine publishes (vLLM's KV
// events, SGLang's): blocks stored in or removed from an instance's cache.
// The Scheduler is one; a publisher's subscriber calls it with the
// instance's ID and the blocks' chained hashes (HashTokens).
type KVEventSink interface {
	BlockStored(instance string, blocks []uint64)
	BlockRemoved(instance string, blocks []uint64)
}

var _ KVEventSink = (*Scheduler)(nil)

// Scheduler is the Conductor's scheduling core: it keeps the prefix index
// and the predicted load of every instance, and picks the prefill and
// decode instances of each request. It is safe for concurrent use.
type Scheduler struct {
	cfg Config

	mu        sync.Mutex
	idx       *Index
	storeSlot int
	prefill   []*prefillInst // in registration order, which breaks ties
	decode    []*decodeInst
	ids       map[string]bool // every registered instance ID
	flights   map[string]*flight
	spare     []*flight // done, for reuse
	rng       *rand.Rand
	lens      []int // scratch: prefix length per holder slot
}

// prefillInst is a prefill instance and the prefills queued on it, in
// FIFO order; the head is the one running.
type prefillInst struct {
	id        string
	slot      int  // holder slot in the index; -1 without a local cache
	events    bool // its KV events feed the index (Instance.Events)
	queue     []*flight
	queued    time.Duration // predicted prefill time of the queue
	headStart time.Duration // when the head began to run
}

// decodeInst is a decode instance and the requests assigned to it that
// have not finished decoding, whether still in prefill or decoding.
type decodeInst struct {
	id     string
	active []*flight
}

// flight is a scheduled request until DecodeDone.
type flight struct {
	id        string
	p         *prefillInst
	d         *decodeInst
	prefill   time.Duration // predicted prefill execution
	tokens    int
	output    int
	join      time.Duration // when it reaches decode: predicted, then actual
	tbt       time.Duration // predicted time between tokens
	prefilled bool
}

// New returns a scheduler without instances, or the error of
// cfg.Validate.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Scheduler{
		cfg:     cfg,
		idx:     NewIndex(),
		ids:     make(map[string]bool),
		flights: make(map[string]*flight),
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	if err := s.idx.AddHolder(StoreHolder, cfg.StoreBlocks); err != nil {
		return nil, err
	}
	s.storeSlot = s.idx.byName[StoreHolder]
	return s, nil
}

// Config returns the configuration in force, defaults filled in.
func (s *Scheduler) Config() Config { return s.cfg }

// Add registers an instance. IDs are unique across roles, and StoreHolder
// is reserved. A prefill instance with CacheBlocks becomes a holder of the
// prefix index; a decode instance's CacheBlocks is ignored.
func (s *Scheduler) Add(in Instance) error {
	switch {
	case in.ID == "":
		return fmt.Errorf("%w Instance: empty ID", ErrInvalid)
	case in.ID == StoreHolder:
		return fmt.Errorf("%w: %q is the store's holder name", ErrDuplicate, in.ID)
	case in.Role != Prefill && in.Role != Decode:
		return fmt.Errorf("%w Instance %q: role %d", ErrInvalid, in.ID, in.Role)
	case in.CacheBlocks < 0:
		return fmt.Errorf("%w Instance %q: negative CacheBlocks %d", ErrInvalid, in.ID, in.CacheBlocks)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids[in.ID] {
		return fmt.Errorf("%w: instance %q", ErrDuplicate, in.ID)
	}
	if in.Role == Decode {
		s.decode = append(s.decode, &decodeInst{id: in.ID})
	} else {
		p := &prefillInst{id: in.ID, slot: -1, events: in.Events}
		if in.CacheBlocks > 0 {
			if err := s.idx.AddHolder(in.ID, in.CacheBlocks); err != nil {
				return err
			}
			p.slot = s.idx.byName[in.ID]
		}
		s.prefill = append(s.prefill, p)
	}
	s.ids[in.ID] = true
	return nil
}

// Remove unregisters an instance and forgets its cache. Requests already
// scheduled on it stay in flight until DecodeDone, but no longer count as
// its load.
func (s *Scheduler) Remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ids[id] {
		return fmt.Errorf("%w: %q", ErrUnknown, id)
	}
	delete(s.ids, id)
	if i := slices.IndexFunc(s.prefill, func(p *prefillInst) bool { return p.id == id }); i >= 0 {
		s.prefill = slices.Delete(s.prefill, i, i+1)
		s.idx.RemoveHolder(id)
	}
	if i := slices.IndexFunc(s.decode, func(d *decodeInst) bool { return d.id == id }); i >= 0 {
		s.decode = slices.Delete(s.decode, i, i+1)
	}
	return nil
}

// Schedule picks the prefill and decode instances of r at time now (a
// duration since an epoch the caller picks and keeps), records the work it
// queues on them (the prefill on the prefill instance's queue, the request
// on the decode instance's batch, the prompt's blocks in the prefill
// instance's cache) and returns the decision with its predictions.
//
// When admission control rejects r, nothing is recorded and the error is
// a *RejectError wrapping ErrRejected; the Decision still carries the
// instances and predictions that were rejected. Other errors: ErrInvalid
// (no ID, negative lengths), ErrDuplicate (r.ID in flight), ErrNoInstance.
func (s *Scheduler) Schedule(now time.Duration, r Request) (Decision, error) {
	switch {
	case r.ID == "":
		return Decision{}, fmt.Errorf("%w Request: empty ID", ErrInvalid)
	case r.Tokens < 0 || r.Output < 0:
		return Decision{}, fmt.Errorf("%w Request %q: negative length (%d tokens, %d output)", ErrInvalid,
			r.ID, r.Tokens, r.Output)
	}
	output := r.Output
	if output == 0 {
		output = s.cfg.DefaultOutput
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.flights[r.ID]; dup {
		return Decision{}, fmt.Errorf("%w: request %q is in flight", ErrDuplicate, r.ID)
	}
	if len(s.prefill) == 0 || len(s.decode) == 0 {
		return Decision{}, fmt.Errorf("%w: %d prefill, %d decode", ErrNoInstance, len(s.prefill), len(s.decode))
	}

	// Prefill (Algorithm 1, lines 1-16).
	s.lens = s.idx.prefixes(r.Blocks, s.lens)
	best, bestSlot := 0, -1
	for slot, n := range s.lens {
		if n > best {
			best, bestSlot = n, slot
		}
	}
	var p *prefillInst
	var pe estimate
	switch s.cfg.Policy {
	case Random:
		p = s.prefill[s.rng.IntN(len(s.prefill))]
		pe = s.estimate(now, p, r.Tokens, best)
	case LoadBalance:
		q := time.Duration(math.MaxInt64)
		for _, c := range s.prefill {
			if t := c.queueTime(now); t < q {
				p, q = c, t
			}
		}
		pe = s.estimate(now, p, r.Tokens, best)
	default:
		pe.ttft = math.MaxInt64
		for _, c := range s.prefill {
			if e := s.estimate(now, c, r.Tokens, best); e.ttft < pe.ttft {
				p, pe = c, e
			}
		}
	}

	// Decode (line 17): the least TBT predicted for when r gets there,
	// among the instances with room for its KV cache if any has.
	join := now + pe.ttft
	var d *decodeInst
	tbt, fits := time.Duration(math.MaxInt64), false
	for _, c := range s.decode {
		t, ok := c.predict(join, r.Tokens, output, s.cfg.Decode)
		if (ok && !fits) || (ok == fits && t < tbt) {
			d, tbt, fits = c, t, ok
		}
	}

	dec := Decision{Prefill: p.id, Decode: d.id, Reused: pe.prefix, Pulled: pe.pulled, TTFT: pe.ttft, TBT: tbt}
	if pe.pulled > 0 {
		dec.Source = s.idx.holders[bestSlot].name
	}

	// Admission (lines 18-19).
	if err := s.admit(now, pe.ttft, tbt, fits, d, r.Tokens); err != nil {
		s.idx.forget()
		return dec, err
	}

	// Commit: the queue, the batch, and the blocks the instance will hold
	// (lines 20-21: pulled ones are replicas of a hot prefix).
	f := s.flight()
	*f = flight{id: r.ID, p: p, d: d, prefill: pe.prefill, tokens: r.Tokens, output: output,
		join: join, tbt: max(tbt, 1)}
	p.enqueue(now, f)
	d.active = append(d.active, f)
	s.flights[r.ID] = f
	if p.slot >= 0 && !p.events {
		s.idx.insert(p.slot, r.Blocks, s.idx.found)
	}
	s.idx.forget()
	return dec, nil
}

// estimate is one prefill instance's prediction for a request.
type estimate struct {
	ttft, prefill  time.Duration
	prefix, pulled int // blocks
}

// estimate predicts TTFT on p for a prompt of tokens whose best prefix
// anywhere is best blocks (Algorithm 1, lines 5-13).
func (s *Scheduler) estimate(now time.Duration, p *prefillInst, tokens, best int) estimate {
	own := 0
	if p.slot >= 0 {
		own = s.lens[p.slot]
	}
	e := estimate{prefix: own}
	var transfer time.Duration
	if s.cfg.Policy == GlobalCacheAware && best-own > s.cfg.BalanceBlocks {
		e.prefix, e.pulled = best, best-own
		transfer = s.cfg.transferTime(e.pulled)
	}
	e.prefill = s.cfg.Prefill.Time(tokens, min(e.prefix*s.cfg.BlockTokens, tokens))
	e.ttft = transfer + p.queueTime(now) + e.prefill
	return e
}

// admit applies admission control to a request predicted to take ttft to
// its first token and tbt between the next ones on decode instance d.
func (s *Scheduler) admit(now, ttft, tbt time.Duration, fits bool, d *decodeInst, tokens int) error {
	switch s.cfg.Admission {
	case RejectNone:
		return nil
	case RejectCurrentLoad:
		tbt, fits = d.current(now, tokens, s.cfg.Decode), true
	}
	switch {
	case ttft > s.cfg.TTFTSLO:
		return &RejectError{Reason: "ttft", Predicted: ttft, SLO: s.cfg.TTFTSLO}
	case !fits:
		return &RejectError{Reason: "kv-memory"}
	case tbt > s.cfg.TBTSLO:
		return &RejectError{Reason: "tbt", Predicted: tbt, SLO: s.cfg.TBTSLO}
	}
	return nil
}

// PrefillDone records that request id finished its prefill at now and
// reached its decode instance. Unknown or repeated calls are ignored.
func (s *Scheduler) PrefillDone(now time.Duration, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.flights[id]
	if !ok || f.prefilled {
		return
	}
	f.p.done(now, f)
	f.prefilled, f.join = true, now
}

// DecodeDone records that request id finished (or failed, or was
// cancelled, at any stage) at now; it leaves the scheduler. Unknown or
// repeated calls are ignored.
func (s *Scheduler) DecodeDone(now time.Duration, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.flights[id]
	if !ok {
		return
	}
	if !f.prefilled {
		f.p.done(now, f)
	}
	if i := slices.Index(f.d.active, f); i >= 0 {
		last := len(f.d.active) - 1
		f.d.active[i], f.d.active[last] = f.d.active[last], nil
		f.d.active = f.d.active[:last]
	}
	delete(s.flights, id)
	*f = flight{}
	s.spare = append(s.spare, f)
}

// flight returns a recycled flight, or a new one: in a steady state,
// scheduling allocates nothing.
func (s *Scheduler) flight() *flight {
	if n := len(s.spare); n > 0 {
		f := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return f
	}
	return new(flight)
}

// Longest returns the prefix of blocks, in blocks, that each holder has:
// prefill instances by ID and the store as StoreHolder. Holders without
// the first block are absent.
func (s *Scheduler) Longest(blocks []uint64) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idx.Longest(blocks)
}

// Replicas is the number of prefill instances whose cache has block k.
func (s *Scheduler) Replicas(k uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.idx.blocks[k]; e != nil {
		return s.replicas(e)
	}
	return 0
}

// replicas is the number of prefill instances that hold e's block: its
// holders but the store.
func (s *Scheduler) replicas(e *entry) int {
	n := int(e.n)
	if e.has(s.storeSlot) {
		n--
	}
	return n
}

// StoreAdded records that the store has blocks (its put events).
func (s *Scheduler) StoreAdded(blocks []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.insert(s.storeSlot, blocks, nil)
}

// StoreEvicted records that the store no longer has blocks (its evict and
// remove events).
func (s *Scheduler) StoreEvicted(blocks []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.Delete(StoreHolder, blocks)
}

// BlockStored records an engine's event: instance cached blocks. Events of
// decode instances, of prefill instances without a cache, and of unknown
// ones are ignored.
func (s *Scheduler) BlockStored(instance string, blocks []uint64) {
	if instance == StoreHolder {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.Insert(instance, blocks)
}

// BlockRemoved records an engine's event: instance dropped blocks.
func (s *Scheduler) BlockRemoved(instance string, blocks []uint64) {
	if instance == StoreHolder {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.Delete(instance, blocks)
}

// queueTime is how long a prefill queued now waits: the predicted time of
// the queue less what the head has run, never below the rest.
func (p *prefillInst) queueTime(now time.Duration) time.Duration {
	if len(p.queue) == 0 {
		return 0
	}
	ran := min(max(now-p.headStart, 0), p.queue[0].prefill)
	return p.queued - ran
}

func (p *prefillInst) enqueue(now time.Duration, f *flight) {
	if len(p.queue) == 0 {
		p.headStart = now
	}
	p.queue = append(p.queue, f)
	p.queued += f.prefill
}

// done takes f off the queue; when it was the head, the next one starts
// now. Engines may finish out of order: f can be anywhere.
func (p *prefillInst) done(now time.Duration, f *flight) {
	i := slices.Index(p.queue, f)
	if i < 0 {
		return
	}
	p.queue = slices.Delete(p.queue, i, i+1)
	p.queued -= f.prefill
	if i == 0 {
		p.headStart = now
	}
}

// generated is how many tokens f will have decoded by at, at its predicted
// pace.
func (f *flight) generated(at time.Duration) int {
	if at <= f.join {
		return 0
	}
	return int(min(int64((at-f.join)/f.tbt), int64(f.output)))
}

// predict is the TBT of d's batch at time at with one more request of
// tokens and output, and whether the batch's KV caches then fit. The
// batch at that time: the requests assigned to d that will not have
// finished by then at their predicted pace, those still in prefill
// included (they will be there during r's decode), with the tokens they
// will have generated.
func (d *decodeInst) predict(at time.Duration, tokens, output int, m DecodeModel) (time.Duration, bool) {
	b, k, mem := 1, tokens, tokens+output
	for _, f := range d.active {
		gen := f.generated(at)
		if gen >= f.output {
			continue
		}
		b++
		k += f.tokens + gen
		mem += f.tokens + f.output
	}
	return m.TBT(b, k), m.KVTokens == 0 || mem <= m.KVTokens
}

// current is the TBT of d's batch as it decodes now, plus one request of
// tokens: what naive admission control looks at.
func (d *decodeInst) current(now time.Duration, tokens int, m DecodeModel) time.Duration {
	b, k := 1, tokens
	for _, f := range d.active {
		if f.prefilled {
			b++
			k += f.tokens + f.generated(now)
		}
	}
	return m.TBT(b, k)
}

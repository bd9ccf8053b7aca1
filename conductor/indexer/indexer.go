package indexer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/kvevents"
)

// Publisher types, as Registration.Type names them.
const (
	TypeVLLM     = "vLLM"
	TypeSGLang   = "SGLang"
	TypeMooncake = "Mooncake"
)

// Registration is one event publisher: an engine's data-parallel rank, or
// a Mooncake master's pool. Its JSON is official Mooncake's /register
// body and config entry.
type Registration struct {
	// Endpoint is the publisher's ZeroMQ PUB socket, tcp://host:port.
	Endpoint string `json:"endpoint"`
	// Replay is its replay ROUTER socket; optional.
	Replay string `json:"replay_endpoint,omitempty"`
	// Type is TypeVLLM, TypeSGLang or TypeMooncake (case-insensitive).
	Type string `json:"type"`
	// Model, LoRA, BlockSize, Salt and Tenant scope the blocks: only a
	// query for the same five sees them. Tenant "" means "default".
	Model     string `json:"modelname"`
	LoRA      string `json:"lora_name,omitempty"`
	Tenant    string `json:"tenant_id,omitempty"`
	BlockSize int    `json:"block_size"`
	Salt      string `json:"additionalsalt,omitempty"`
	// Instance is the router-facing engine; one instance has a
	// registration per DP rank. A Mooncake pool's instance is not an
	// engine: its blocks count for every engine of its scope.
	Instance string `json:"instance_id"`
	DPRank   int    `json:"dp_rank"`
	// CacheGroup must be 0 (vLLM's first KV cache group).
	CacheGroup int `json:"cache_group,omitempty"`
	// Hash says how the publisher hashes blocks, for queries by tokens.
	// Nil: the type's default (vLLM: its default sha256; SGLang and
	// Mooncake: the KV Events API's XXH3-64, seed 0).
	Hash *HashProfile `json:"hash_profile,omitempty"`
}

// HashProfile is official Mooncake's hash_profile.
type HashProfile struct {
	// Strategy is "vllm_v1" (vLLM's chained block hashes) or "xxh3"
	// (the KV Events API's standard hash).
	Strategy string `json:"strategy"`
	// Algorithm is vLLM's --prefix-caching-hash-algo (sha256,
	// sha256_cbor, xxhash, xxhash_cbor).
	Algorithm string `json:"algorithm,omitempty"`
	// Seed is vLLM's PYTHONHASHSEED, as the exact text of the variable
	// ("" when unset); for xxh3, the decimal seed.
	Seed string `json:"python_hash_seed,omitempty"`
	// Projection is how a hash becomes the 64-bit id; only "low64_be"
	// (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) is supported.
	Projection string `json:"index_projection,omitempty"`
}

// ErrInvalid is wrapped by the errors of malformed registrations and
// queries (HTTP 400), and of configuration files that hold such values.
var ErrInvalid = errors.New("indexer: invalid request")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// normalize checks r and fills its defaults.
func (r *Registration) normalize() error {
	switch strings.ToLower(r.Type) {
	case "vllm":
		r.Type = TypeVLLM
	case "sglang":
		r.Type = TypeSGLang
	case "mooncake":
		r.Type = TypeMooncake
	default:
		return invalid("type %q: want vLLM, SGLang or Mooncake", r.Type)
	}
	if r.Endpoint == "" {
		return invalid("endpoint is required")
	}
	if r.Instance == "" || strings.Contains(r.Instance, "|") {
		return invalid("instance_id %q must be non-empty, without '|'", r.Instance)
	}
	if r.BlockSize <= 0 {
		return invalid("block_size %d: want > 0", r.BlockSize)
	}
	if r.DPRank < 0 {
		return invalid("dp_rank %d: want >= 0", r.DPRank)
	}
	if r.CacheGroup != 0 {
		return invalid("cache_group %d: only 0 is supported", r.CacheGroup)
	}
	r.Tenant = cmp.Or(r.Tenant, "default")
	if _, err := r.scheme(); err != nil {
		return invalid("hash_profile: %v", err)
	}
	return nil
}

// scheme is how r's blocks are named, for queries by tokens.
func (r *Registration) scheme() (blockhash.Scheme, error) {
	p := r.Hash
	if p == nil {
		if r.Type == TypeVLLM {
			return blockhash.Parse("vllm:sha256", r.BlockSize, "")
		}
		return blockhash.Parse("mooncake", r.BlockSize, "")
	}
	if p.Projection != "" && p.Projection != "low64_be" {
		return nil, fmt.Errorf("index_projection %q: only low64_be is supported", p.Projection)
	}
	switch p.Strategy {
	case "vllm_v1", "vllm":
		return blockhash.Parse("vllm:"+cmp.Or(p.Algorithm, "sha256"), r.BlockSize, p.Seed)
	case "xxh3", "mooncake", "standard":
		return blockhash.Parse("mooncake", r.BlockSize, p.Seed)
	}
	return nil, fmt.Errorf("strategy %q: want vllm_v1 or xxh3", p.Strategy)
}

// key is the service key official Mooncake answers /unregister with.
func (r *Registration) key() string {
	return r.Instance + "|" + r.Tenant + "|" + strconv.Itoa(r.DPRank)
}

func (r *Registration) scope() scope {
	return scope{tenant: r.Tenant, model: r.Model, lora: r.LoRA, salt: r.Salt, blockSize: r.BlockSize}
}

// scope is what blocks must share to be compared: two engines' blocks of
// different models, adapters, block sizes, salts or tenants never match.
type scope struct {
	tenant, model, lora, salt string
	blockSize                 int
}

// Mirror receives, for engines, the changes of what each instance holds
// on its device (medium GPU, or unnamed), whatever the rank: a block is
// stored when a first rank of the instance has it, and removed when the
// last one drops it. The conductor's Scheduler is one
// (conductor.KVEventSink). A Mirror that is also a StoreMirror receives
// the pools' (Mooncake masters') blocks too.
type Mirror interface {
	BlockStored(instance string, blocks []uint64)
	BlockRemoved(instance string, blocks []uint64)
}

// StoreMirror receives the blocks the pools of a scope gain (a first pool
// holds them, on any medium) and lose (the last one drops them); the
// conductor's Scheduler is one (its store holder).
type StoreMirror interface {
	StoreAdded(blocks []uint64)
	StoreEvicted(blocks []uint64)
}

// Config configures an Indexer.
type Config struct {
	// Mirror, if set, is kept in step with the engines' device caches.
	Mirror Mirror
	// DownAfter is how long a publisher may be unreachable before its
	// blocks leave the index. Zero: kvevents.DefaultDownAfter.
	DownAfter time.Duration
	// Logger logs registrations and the subscribers' events. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Indexer is a global KV-cache index fed by the publishers registered with
// it, drop-in for official Mooncake's Conductor indexer: it answers, per
// engine instance, how long a prefix of a prompt is cached, on which
// medium and on which DP rank.
type Indexer struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.RWMutex
	sources map[string]*source // by Registration.key()
	scopes  map[scope]*blocks
	// mirrorMu orders the calls to Config.Mirror (handOff).
	mirrorMu sync.Mutex
}

// source is one registered publisher and what it holds.
type source struct {
	reg    Registration
	sub    *kvevents.Subscriber
	stop   context.CancelFunc
	done   chan struct{}
	blocks *blocks
	// held maps each block the source holds to its media.
	held map[uint64]media
	pool bool // a Mooncake pool, not an engine rank
	// defMedium is the medium of events that name none.
	defMedium string
	// gone is set once unregistered: late events are dropped.
	gone bool
	// lag is how late the last batch arrived: its arrival less the
	// publisher's timestamp, seconds.
	lag float64
}

// blocks are the holders of every block of one scope.
type blocks struct {
	by map[uint64][]*source
}

// media is a set of media, by bit; mediaBit names them.
type media uint16

var mediaBits = map[string]media{kvevents.GPU: 1, kvevents.CPU: 2, kvevents.Disk: 4}

// mediaNames are the media reported by every query, in this order.
var mediaNames = []string{kvevents.GPU, kvevents.CPU, kvevents.Disk}

func bitOf(m string) media {
	if b, ok := mediaBits[m]; ok {
		return b
	}
	return 8 // another medium: held, on no named tier
}

// New returns an Indexer with no publishers; Close stops it.
func New(cfg Config) *Indexer {
	ctx, cancel := context.WithCancel(context.Background())
	return &Indexer{
		cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()),
		ctx: ctx, cancel: cancel,
		sources: map[string]*source{}, scopes: map[scope]*blocks{},
	}
}

// Close unsubscribes from every publisher and waits for the subscribers.
func (x *Indexer) Close() {
	x.cancel()
	x.wg.Wait()
}

// ErrConflict is wrapped by Register's error when the service key
// (instance, tenant, DP rank) or the endpoint is taken by another
// registration (HTTP 409).
var ErrConflict = errors.New("indexer: already registered")

// ErrNotFound is wrapped by Unregister's error for an unknown key (404).
var ErrNotFound = errors.New("indexer: not registered")

// Register subscribes to r's publisher. Registering the same publisher
// again with the same fields is a no-op.
func (x *Indexer) Register(r Registration) error {
	if err := r.normalize(); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ctx.Err() != nil {
		return errors.New("indexer: closed")
	}
	if old, ok := x.sources[r.key()]; ok {
		if sameRegistration(old.reg, r) {
			return nil
		}
		return fmt.Errorf("%w: %s, with endpoint %s", ErrConflict, r.key(), old.reg.Endpoint)
	}
	for _, s := range x.sources {
		if s.reg.Endpoint == r.Endpoint {
			return fmt.Errorf("%w: endpoint %s, by %s", ErrConflict, r.Endpoint, s.reg.key())
		}
	}
	s := &source{reg: r, held: map[uint64]media{}, pool: r.Type == TypeMooncake, done: make(chan struct{})}
	s.defMedium = kvevents.GPU
	if s.pool {
		s.defMedium = kvevents.CPU
	}
	sub, err := kvevents.New(kvevents.Config{
		Endpoint: r.Endpoint, Replay: r.Replay, DownAfter: x.cfg.DownAfter,
		Logger: x.log.With("instance", r.Instance, "dp_rank", r.DPRank),
	}, &handler{x: x, s: s})
	if err != nil {
		return invalid("%v", err)
	}
	s.sub = sub
	sc := r.scope()
	if x.scopes[sc] == nil {
		x.scopes[sc] = &blocks{by: map[uint64][]*source{}}
	}
	s.blocks = x.scopes[sc]
	x.sources[r.key()] = s
	ctx, stop := context.WithCancel(x.ctx)
	s.stop = stop
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		defer close(s.done)
		_ = sub.Run(ctx)
	}()
	x.log.Info("indexer: registered", "key", r.key(), "type", r.Type, "endpoint", r.Endpoint, "model", r.Model, "block_size", r.BlockSize)
	return nil
}

func sameRegistration(a, b Registration) bool {
	ha, hb := a.Hash, b.Hash
	a.Hash, b.Hash = nil, nil
	return a == b && (ha == nil) == (hb == nil) && (ha == nil || *ha == *hb)
}

// Unregister stops following the publisher of instance's DP rank under
// tenant ("" for "default") and drops its blocks; it returns the removed
// service key.
func (x *Indexer) Unregister(instance, tenant string, dpRank int) (string, error) {
	key := instance + "|" + cmp.Or(tenant, "default") + "|" + strconv.Itoa(dpRank)
	x.mu.Lock()
	s, ok := x.sources[key]
	var removed []uint64
	if ok {
		delete(x.sources, key)
		removed = x.dropAll(s)
		s.gone = true
		x.handOff()
		(&handler{x: x, s: s}).mirror(nil, removed)
		x.mirrorMu.Unlock()
	} else {
		x.mu.Unlock()
	}
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	s.stop()
	<-s.done
	x.log.Info("indexer: unregistered", "key", key)
	return key, nil
}

// Registrations lists the registered publishers, by service key.
func (x *Indexer) Registrations() []Registration {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]Registration, 0, len(x.sources))
	for _, s := range x.sources {
		out = append(out, s.reg)
	}
	slices.SortFunc(out, func(a, b Registration) int { return strings.Compare(a.key(), b.key()) })
	return out
}

// SourceStats is one publisher's state, for /services and /metrics.
type SourceStats struct {
	Registration
	Key    string         `json:"key"`
	Blocks int            `json:"blocks"`
	Events kvevents.Stats `json:"events"`
	// Lag is how late the last batch arrived, seconds (its arrival less
	// the publisher's timestamp; clock skew included).
	Lag float64 `json:"lag_seconds"`
}

// Stats returns every publisher's state, by service key.
func (x *Indexer) Stats() []SourceStats {
	x.mu.RLock()
	out := make([]SourceStats, 0, len(x.sources))
	subs := make([]*kvevents.Subscriber, 0, len(x.sources))
	for _, s := range x.sources {
		out = append(out, SourceStats{Registration: s.reg, Key: s.reg.key(), Blocks: len(s.held), Lag: s.lag})
		subs = append(subs, s.sub)
	}
	x.mu.RUnlock()
	for i, sub := range subs {
		out[i].Events = sub.Stats()
	}
	slices.SortFunc(out, func(a, b SourceStats) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// handler applies one source's batches.
type handler struct {
	x *Indexer
	s *source
}

func (h *handler) Apply(b *kvevents.Batch) {
	x, s := h.x, h.s
	var stored, removed []uint64 // the mirror's changes
	x.mu.Lock()
	if s.gone {
		x.mu.Unlock()
		return
	}
	if b.Time > 0 {
		s.lag = float64(time.Now().UnixNano())/1e9 - b.Time
	}
	for i := range b.Events {
		e := &b.Events[i]
		m := bitOf(cmp.Or(e.Medium, s.defMedium))
		switch e.Kind {
		case kvevents.Stored:
			for _, k := range e.Hashes {
				if x.add(s, k, m) {
					stored = append(stored, k)
				}
			}
		case kvevents.Removed:
			for _, k := range e.Hashes {
				if x.remove(s, k, m) {
					removed = append(removed, k)
				}
			}
		case kvevents.Cleared:
			removed = append(removed, x.dropAll(s)...)
		}
	}
	x.handOff()
	defer x.mirrorMu.Unlock()
	h.mirror(stored, removed)
}

func (h *handler) Reset(reason string) {
	x := h.x
	x.mu.Lock()
	if h.s.gone {
		x.mu.Unlock()
		return
	}
	removed := x.dropAll(h.s)
	x.handOff()
	defer x.mirrorMu.Unlock()
	x.log.Info("indexer: publisher reset", "key", h.s.reg.key(), "reason", reason, "blocks", len(removed))
	h.mirror(nil, removed)
}

// handOff trades x.mu (held) for x.mirrorMu, so that the mirror sees the
// changes in the order they were made to the index, whichever publishers'
// goroutines made them, without holding the index while it calls out.
func (x *Indexer) handOff() {
	x.mirrorMu.Lock()
	x.mu.Unlock()
}

func (h *handler) mirror(stored, removed []uint64) {
	switch m := h.x.cfg.Mirror; {
	case m == nil:
	case h.s.pool:
		sm, ok := m.(StoreMirror)
		if !ok {
			return
		}
		if len(removed) > 0 {
			sm.StoreEvicted(removed)
		}
		if len(stored) > 0 {
			sm.StoreAdded(stored)
		}
	default:
		if len(removed) > 0 {
			m.BlockRemoved(h.s.reg.Instance, removed)
		}
		if len(stored) > 0 {
			m.BlockStored(h.s.reg.Instance, stored)
		}
	}
}

// deviceBit is what the mirror follows of an engine: its device cache.
const deviceBit = media(1)

// mirrored are the media of s the mirror follows: an engine's device, any
// medium of a pool.
func (s *source) mirrored() media {
	if s.pool {
		return ^media(0)
	}
	return deviceBit
}

// add records that s holds k on m; it reports whether the mirror gains k
// (for an engine: k is new on its instance's device; for a pool: new in
// the pools of its scope). x.mu is held.
func (x *Indexer) add(s *source, k uint64, m media) bool {
	old, ok := s.held[k]
	if !ok {
		s.blocks.by[k] = append(s.blocks.by[k], s)
	}
	s.held[k] = old | m
	t := s.mirrored()
	return m&t != 0 && old&t == 0 && !x.heldElsewhere(s, k)
}

// remove records that s no longer holds k on m; it reports whether the
// mirror loses k. x.mu is held.
func (x *Indexer) remove(s *source, k uint64, m media) bool {
	old, ok := s.held[k]
	if !ok {
		return false
	}
	now := old &^ m
	if now != 0 {
		s.held[k] = now
	} else {
		x.unlink(s, k)
	}
	t := s.mirrored()
	return old&t != 0 && now&t == 0 && !x.heldElsewhere(s, k)
}

// dropAll forgets everything s holds; it returns the blocks the mirror
// loses. x.mu is held.
func (x *Indexer) dropAll(s *source) []uint64 {
	var gone []uint64
	t := s.mirrored()
	for k, m := range s.held {
		x.unlink(s, k)
		if m&t != 0 && !x.heldElsewhere(s, k) {
			gone = append(gone, k)
		}
	}
	clear(s.held)
	return gone
}

func (x *Indexer) unlink(s *source, k uint64) {
	delete(s.held, k)
	hs := slices.DeleteFunc(s.blocks.by[k], func(o *source) bool { return o == s })
	if len(hs) == 0 {
		delete(s.blocks.by, k)
	} else {
		s.blocks.by[k] = hs
	}
}

// heldElsewhere says whether the mirror still has k from another source
// than s: another rank of s's instance, on its device; another pool of the
// scope, on any medium. x.mu is held.
func (x *Indexer) heldElsewhere(s *source, k uint64) bool {
	for _, o := range s.blocks.by[k] {
		switch {
		case o == s || o.pool != s.pool:
		case s.pool && o.held[k] != 0:
			return true
		case !s.pool && o.reg.Instance == s.reg.Instance && o.held[k]&deviceBit != 0:
			return true
		}
	}
	return false
}

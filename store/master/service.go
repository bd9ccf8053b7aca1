package master

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Placement strategies for ServiceConfig.Strategy, as Mooncake's
// --allocation_strategy.
const (
	// StrategyRandom scans the segments from a random start (the default).
	StrategyRandom = "random"
	// StrategyFreeRatioFirst tries the segments with the most free space first.
	StrategyFreeRatioFirst = "free_ratio_first"
	// StrategyLocalFirst tries the segments on the caller's host first.
	StrategyLocalFirst = "local_first"
)

// Limits on what one request may ask of the master (ServiceConfig's Max
// fields). A request over one is refused whole with INVALID_PARAMS, before
// anything of it is applied, and the message names the limit.
const (
	// MaxKeyLen is the default longest object key, in bytes.
	MaxKeyLen = 4096
	// DefaultMaxValueLen is the default largest value of one put. A value
	// costs the master no memory, only pool space, so the limit is policy:
	// generous, a value lives in one segment, and none is this large in
	// practice (a larger one is refused, not tried against the pool).
	DefaultMaxValueLen = 1 << 40
	// DefaultMaxBatch is the default most keys of one batch call. With
	// keys of MaxKeyLen it fills DefaultMaxRecvMsgSize.
	DefaultMaxBatch = 1 << 16
	// DefaultMaxBatchValueBytes is the default most value bytes one batch
	// put may reserve in all.
	DefaultMaxBatchValueBytes = 16 << 40
	// DefaultMaxWatchers is the default most WatchObjects streams served
	// at once; each holds a buffer of DefaultWatchBuffer events.
	DefaultMaxWatchers = 256
	// DefaultStripeCount is the default pieces of a striped replica.
	DefaultStripeCount = 4
	// MaxStripes is the most pieces one replica may be cut into.
	MaxStripes = 64
	// minPiece is the smallest piece a replica is cut into: smaller
	// values get fewer pieces. An engine slice (64 KiB) or more keeps a
	// piece's transfer worth its request.
	minPiece = 64 << 10
	// pieceAlign aligns every piece but the last to a page, so pieces
	// start page-aligned in the value as in their segments.
	pieceAlign = 4096
)

// Mooncake's defaults (mooncake-internals §2.5-2.6).
const (
	DefaultLeaseTTL               = 10 * time.Second
	DefaultSoftPinTTL             = 30 * time.Minute
	DefaultEvictionHighWatermark  = 0.90
	DefaultEvictionRatio          = 0.05
	DefaultClientTTL              = 10 * time.Second
	DefaultPutStartDiscardTimeout = 30 * time.Second
	DefaultPutStartReleaseTimeout = 10 * time.Minute
	DefaultShards                 = 1024
)

// DefaultRemountHold is ServiceConfig.RemountHold's default (Mooncake has
// none): twice a slot's usable age (store/client slotMaxAge), and ten of a
// client's pings, in which a client that held space the master forgot
// hears of the change and drops its slots.
const DefaultRemountHold = 10 * time.Second

// Intervals of the Run loop, as Mooncake's eviction thread and client
// monitor.
const (
	evictInterval   = 10 * time.Millisecond
	monitorInterval = time.Second
)

// ServiceConfig configures a Service. The zero value of every field means
// Mooncake's default.
type ServiceConfig struct {
	// LeaseTTL is how long a GetReplicaList or ExistKey protects an object
	// from Remove and eviction. Zero means 10s.
	LeaseTTL time.Duration
	// SoftPinTTL is the soft-pin lifetime when a put asks for a soft pin
	// without its own TTL; it runs from the PutEnd. Zero means 30min.
	SoftPinTTL time.Duration
	// EvictionHighWatermark is the used/capacity ratio above which
	// eviction starts, in (0, 1]. Zero means 0.90.
	EvictionHighWatermark float64
	// EvictionRatio is the share of capacity one eviction round frees at
	// least, in (0, 1]. Zero means 0.05.
	EvictionRatio float64
	// ClientTTL is how long a client may go without a Ping (or mount)
	// before ExpireClients unmounts its segments. Zero means 10s.
	ClientTTL time.Duration
	// PutStartDiscardTimeout is the age after which an unfinished PutStart
	// may be pre-empted by another PutStart of the same key. Zero means 30s.
	PutStartDiscardTimeout time.Duration
	// PutStartReleaseTimeout is the age after which the Run loop frees an
	// unfinished PutStart's space. Zero means 10min.
	PutStartReleaseTimeout time.Duration
	// RemountHold is how long a segment mounted again by ReMountSegment,
	// unknown to this master, takes no new replicas: clients may still
	// write there into space an earlier master (one restarted without a
	// journal) or this one (before it expired the segment's client)
	// granted. Zero means 10s, negative none.
	RemountHold time.Duration
	// Shards is the number of metadata shards (one mutex each) keys are
	// hashed over. Zero means 1024.
	Shards int
	// Strategy is the replica placement: StrategyRandom (also for ""),
	// StrategyFreeRatioFirst or StrategyLocalFirst.
	Strategy string
	// Now is the clock. Nil means time.Now; tests inject a fake one.
	Now func() time.Time
	// Seed seeds the random placement. Zero means a random seed.
	Seed uint64
	// ViewVersion is reported by Ping: the master's view (its leader term
	// under HA). Clients remount when it changes.
	ViewVersion uint64

	// MaxKeyLen is the longest key accepted, in bytes. Zero means
	// MaxKeyLen (4 KiB).
	MaxKeyLen int
	// MaxValueLen is the largest value one put or upsert may store, in
	// bytes. Zero means DefaultMaxValueLen (1 TiB).
	MaxValueLen uint64
	// MaxBatch is the most keys (or items) one batch call may carry. Zero
	// means DefaultMaxBatch (65536).
	MaxBatch int
	// MaxBatchValueBytes is the most value bytes one batch put or upsert
	// may reserve, all items together. Zero means
	// DefaultMaxBatchValueBytes (16 TiB).
	MaxBatchValueBytes uint64
	// MaxWatchers is the most WatchObjects streams served at once; more
	// are refused with ResourceExhausted. Zero means DefaultMaxWatchers
	// (256).
	MaxWatchers int

	// StripeMinSize: a put of at least this many bytes that does not say
	// how to stripe (ReplicateConfig.stripe_count 0) has each replica cut
	// into StripeCount pieces on distinct segments, which a reader moves
	// in parallel. Zero means never.
	StripeMinSize uint64
	// StripeCount is the pieces of a striped replica when the put does
	// not name them. Zero means DefaultStripeCount (4).
	StripeCount int

	// Tenants holds the tenants' quotas (tenant_quota.go), shared by the
	// Services of successive terms. Nil means none.
	Tenants *TenantQuotas
}

// Validate reports the first field that is out of range, by name.
func (c ServiceConfig) Validate() error {
	durs := []struct {
		name string
		d    time.Duration
	}{
		{"LeaseTTL", c.LeaseTTL}, {"SoftPinTTL", c.SoftPinTTL}, {"ClientTTL", c.ClientTTL},
		{"PutStartDiscardTimeout", c.PutStartDiscardTimeout},
		{"PutStartReleaseTimeout", c.PutStartReleaseTimeout},
	}
	for _, d := range durs {
		if d.d < 0 {
			return fmt.Errorf("master: ServiceConfig.%s is negative (%v)", d.name, d.d)
		}
	}
	if c.EvictionHighWatermark < 0 || c.EvictionHighWatermark > 1 {
		return fmt.Errorf("master: ServiceConfig.EvictionHighWatermark %v is outside [0, 1]", c.EvictionHighWatermark)
	}
	if c.EvictionRatio < 0 || c.EvictionRatio > 1 {
		return fmt.Errorf("master: ServiceConfig.EvictionRatio %v is outside [0, 1]", c.EvictionRatio)
	}
	ints := []struct {
		name string
		n    int
	}{{"Shards", c.Shards}, {"MaxKeyLen", c.MaxKeyLen}, {"MaxBatch", c.MaxBatch}, {"MaxWatchers", c.MaxWatchers},
		{"StripeCount", c.StripeCount}}
	for _, n := range ints {
		if n.n < 0 {
			return fmt.Errorf("master: ServiceConfig.%s is negative (%d)", n.name, n.n)
		}
	}
	if c.StripeCount > MaxStripes {
		return fmt.Errorf("master: ServiceConfig.StripeCount %d is over %d", c.StripeCount, MaxStripes)
	}
	switch c.Strategy {
	case "", StrategyRandom, StrategyFreeRatioFirst, StrategyLocalFirst:
	default:
		return fmt.Errorf("master: ServiceConfig.Strategy %q is unknown", c.Strategy)
	}
	return nil
}

func (c ServiceConfig) withDefaults() ServiceConfig {
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.SoftPinTTL = cmp.Or(c.SoftPinTTL, DefaultSoftPinTTL)
	c.ClientTTL = cmp.Or(c.ClientTTL, DefaultClientTTL)
	c.PutStartDiscardTimeout = cmp.Or(c.PutStartDiscardTimeout, DefaultPutStartDiscardTimeout)
	c.RemountHold = cmp.Or(c.RemountHold, DefaultRemountHold)
	c.PutStartReleaseTimeout = cmp.Or(c.PutStartReleaseTimeout, DefaultPutStartReleaseTimeout)
	c.EvictionHighWatermark = cmp.Or(c.EvictionHighWatermark, DefaultEvictionHighWatermark)
	c.EvictionRatio = cmp.Or(c.EvictionRatio, DefaultEvictionRatio)
	c.Shards = cmp.Or(c.Shards, DefaultShards)
	c.Strategy = cmp.Or(c.Strategy, StrategyRandom)
	c.MaxKeyLen = cmp.Or(c.MaxKeyLen, MaxKeyLen)
	c.MaxValueLen = cmp.Or(c.MaxValueLen, DefaultMaxValueLen)
	c.MaxBatch = cmp.Or(c.MaxBatch, DefaultMaxBatch)
	c.MaxBatchValueBytes = cmp.Or(c.MaxBatchValueBytes, DefaultMaxBatchValueBytes)
	c.MaxWatchers = cmp.Or(c.MaxWatchers, DefaultMaxWatchers)
	c.StripeCount = cmp.Or(c.StripeCount, DefaultStripeCount)
	if c.Now == nil {
		c.Now = time.Now
	}
	c = c.withTenants()
	c.Seed = cmp.Or(c.Seed, rand.Uint64())
	return c
}

// Service is the master's metadata core: segments, objects, leases and
// eviction, without any transport. It is safe for concurrent use.
//
// Locking: object metadata is split over shards by key hash, one mutex
// each; segments, their allocators and the client table sit under segMu.
// A shard lock may be held while taking segMu, never the reverse, so a
// PutStart allocates with its key's shard locked and an unmount marks its
// segment dead before it sweeps the shards.
type Service struct {
	cfg   ServiceConfig
	seed  maphash.Seed
	slots *slotNames // names of reserved slots (reserve.go)
	// reserving holds, for each reserve with a nonce that is running, a
	// channel closed when it ends (reserve.go).
	reserving sync.Map
	shards    []shard

	segMu    sync.Mutex
	segs     map[string]*segment // by id
	segList  []*segment          // the same, for random placement
	clients  map[string]*client
	rng      *rand.Rand
	deferred []deferredFree // replaced replicas freed when their lease ends

	// j journals durable changes under HA; nil otherwise.
	j journal

	// needEvict is set by a failed allocation and makes the next Evict run
	// even below the watermark, as Mooncake's need_mem_eviction_.
	needEvict atomic.Bool
	// evictMu serializes evictions. evictHeads is a DRAM eviction's merge
	// of the shards' eviction orders (evictPass), diskEvictBuf an SSD
	// tier's candidate list, both kept between evictions; evictVisited
	// counts the objects DRAM evictions looked at (for tests).
	evictMu      sync.Mutex
	evictHeads   []orderHead
	diskEvictBuf []candidate
	evictVisited uint64

	// Moves (SSD spills and promotions) in flight, by id; under segMu.
	tasks    map[uint64]*moveTask
	nextTask uint64
	spilling uint64        // DRAM bytes spills in flight will free
	freeing  atomic.Uint64 // bytes freed once their journal records are durable
	// diskTiers counts the mounted SSD tiers; written under segMu, read
	// without it by the per-object paths that only need to know whether
	// there is one (a put's offload, an eviction's spill).
	diskTiers atomic.Int32

	// tenants is the quota admission state (tenant_quota.go).
	tenants tenantLedger

	// Watches of the readable keys (watch.go).
	watch watchers
	// kv publishes KV events (kvevents.go) while this service leads; nil
	// otherwise.
	kv atomic.Pointer[kvPublisher]

	// Counters for metrics.
	evictedKeys, evictedBytes atomic.Uint64
	spilled, promoted         atomic.Uint64
	offloaded                 atomic.Uint64
	discarded, released       atomic.Uint64
	allocFailures             atomic.Uint64

	// Counters for the official metrics only (metrics.go): evictions run
	// (watermark or forced) and those that freed bytes, promotions.
	evictAttempts, evictSuccesses atomic.Uint64
	promo                         promotionCounts
	// Drain jobs (admin_drain.go).
	drains drainSet
}

type shard struct {
	mu      sync.Mutex
	objects map[string]*object
	// gone is the values of the shard's keys removed or replaced, which
	// SSD tiers mounted again must not bring back (tier_announce.go).
	gone goneValues
	// order is the objects DRAM eviction may take (evict_order.go).
	order evictOrder
}

// NewService returns a Service with no segments and no objects.
func NewService(cfg ServiceConfig) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{
		cfg:     cfg,
		seed:    maphash.MakeSeed(),
		slots:   newSlotNames(),
		shards:  make([]shard, cfg.Shards),
		segs:    make(map[string]*segment),
		clients: make(map[string]*client),
		tasks:   make(map[uint64]*moveTask),
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	for i := range s.shards {
		s.shards[i].objects = make(map[string]*object)
	}
	return s, nil
}

// Config returns the configuration in force, defaults filled in.
func (s *Service) Config() ServiceConfig { return s.cfg }

func (s *Service) now() time.Time { return s.cfg.Now() }

func (s *Service) shardOf(key string) *shard { return &s.shards[s.shardIndex(key)] }

func (s *Service) shardIndex(key string) uint64 {
	return maphash.String(s.seed, key) % uint64(len(s.shards))
}

// storeErr builds a store error of code c; errors.Is matches its sentinel.
func storeErr(c storepb.Code, format string, args ...any) error {
	return &storepb.Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// errNoSpace is internal: an allocation placed no replica.
var errNoSpace = errors.New("master: no space")

// Stats is a snapshot of the pool.
type Stats struct {
	Capacity      uint64 // bytes in mounted DRAM segments
	Used          uint64 // bytes allocated there, puts in flight included
	DiskCapacity  uint64 // bytes in mounted SSD tiers
	DiskUsed      uint64 // bytes allocated there
	Spilled       uint64 // objects moved from DRAM to an SSD tier
	Promoted      uint64 // objects copied back to DRAM after a hit
	Offloaded     uint64 // objects copied to an SSD tier after their put
	Keys          int    // readable (complete) objects
	SoftPinned    int    // readable objects with a soft pin running
	ValueBytes    uint64 // bytes of readable values (one replica each)
	Clients       int    // clients known to the master
	Segments      int    // mounted segments
	HeldSegments  int    // of those, held from new replicas after a remount (RemountHold)
	MovesInFlight int    // moves handed to clients and not ended (restored ones included)
	EvictedKeys   uint64 // objects evicted since start
	EvictedBytes  uint64 // bytes freed by eviction since start
	Discarded     uint64 // zombie puts pre-empted by a new PutStart
	Released      uint64 // zombie puts reclaimed by the Run loop
	AllocFailures uint64 // PutStarts that found no space
}

// Stats returns a snapshot; the fields are read at slightly different times.
func (s *Service) Stats() Stats {
	var st Stats
	s.segMu.Lock()
	st.Capacity, st.Used = s.usageLocked(storepb.Medium_MEDIUM_DRAM)
	st.DiskCapacity, st.DiskUsed = s.usageLocked(storepb.Medium_MEDIUM_DISK)
	st.Clients, st.Segments = len(s.clients), len(s.segs)
	for _, sg := range s.segList {
		if s.heldLocked(sg) {
			st.HeldSegments++
		}
	}
	for _, t := range s.tasks {
		if t.handed {
			st.MovesInFlight++
		}
	}
	s.segMu.Unlock()
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, o := range sh.objects {
			if o.complete() {
				st.Keys++
				st.ValueBytes += o.size
				if o.softPinUntil.After(now) {
					st.SoftPinned++
				}
			}
		}
		sh.mu.Unlock()
	}
	st.EvictedKeys, st.EvictedBytes = s.evictedKeys.Load(), s.evictedBytes.Load()
	st.Spilled, st.Promoted, st.Offloaded = s.spilled.Load(), s.promoted.Load(), s.offloaded.Load()
	st.Discarded, st.Released, st.AllocFailures = s.discarded.Load(), s.released.Load(), s.allocFailures.Load()
	return st
}

// entries is the number of objects and puts in flight the shards hold.
func (s *Service) entries() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.objects)
		sh.mu.Unlock()
	}
	return n
}

// Run does the background work until ctx is done: Evict every 10 ms,
// ExpireClients and ReclaimPuts every second. It returns nil.
func (s *Service) Run(ctx context.Context) error {
	evict := time.NewTicker(evictInterval)
	defer evict.Stop()
	monitor := time.NewTicker(monitorInterval)
	defer monitor.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-evict.C:
			s.Evict()
		case <-monitor.C:
			s.ExpireClients()
			s.ReclaimPuts()
			s.expireTasks()
			s.stepDrains()
		}
	}
}

package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Tenant quotas. A tenant with a quota may hold at most that many bytes of
// DRAM in the pool: its readable objects' DRAM replicas and its puts in
// flight (every replica counts). A PutStart that would take the tenant over
// its quota first evicts the tenant's own oldest objects (never another
// tenant's: they are within their quotas, or have none), and, if that does
// not make room, is refused with TENANT_QUOTA_EXCEEDED, naming the tenant
// and its quota. A read that promotes an object from SSD back into DRAM is
// not refused for the quota; the tenant's next put counts it, and evicts
// first. A tenant without a quota is limited by the pool only, as every
// tenant is on a master without quotas.
//
// The quotas are policy, kept by the TenantQuotas shared by the Services of
// successive terms, and where the operator keeps them (QuotaStore: the
// --tenant_quota_connector_uri file). What a tenant is charged is derived
// from its objects, which the journal replays, so a new leader charges it
// the same.

// TenantQuotas is the tenants' quotas, in bytes. It is safe for concurrent
// use; one TenantQuotas serves the Services of all terms of a Server.
type TenantQuotas struct {
	mu      sync.Mutex
	quotas  map[string]uint64
	store   QuotaStore
	gen     uint64            // bumped by every change of the quotas
	rejects map[string]uint64 // PutStarts refused, by tenant
	evicted map[string]uint64 // bytes evicted to admit the tenant's own puts
}

// QuotaStore keeps the quota policy between restarts, and between the
// masters of an HA cluster where they share it.
type QuotaStore interface {
	// Load returns the quotas stored, none when nothing is.
	Load() (map[string]uint64, error)
	// Save replaces the quotas stored.
	Save(map[string]uint64) error
}

// errQuotaStore wraps a QuotaStore's failure to save.
var errQuotaStore = errors.New("master: storing the tenant quotas")

// MaxTenantQuota is the largest quota accepted, as Mooncake's (2^63-1).
const MaxTenantQuota = 1<<63 - 1

// NewTenantQuotas returns the quotas store holds (nil: none, kept in
// memory only).
func NewTenantQuotas(store QuotaStore) (*TenantQuotas, error) {
	q := &TenantQuotas{quotas: map[string]uint64{}, store: store,
		rejects: map[string]uint64{}, evicted: map[string]uint64{}}
	if store == nil {
		return q, nil
	}
	m, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("master: loading the tenant quotas: %w", err)
	}
	for t, b := range m {
		if err := checkQuota(t, b); err != nil {
			return nil, fmt.Errorf("master: loading the tenant quotas: %w", err)
		}
		q.quotas[t] = b
	}
	return q, nil
}

// withTenants gives c a TenantQuotas of its own if it has none: a Server
// calls it once, so that the Services of all its terms share one. Each
// call reloads the quotas from their store, so that a master that takes
// the lead admits by what the store holds now, the changes an earlier
// leader made to a store they share included.
func (c ServiceConfig) withTenants() ServiceConfig {
	if c.Tenants == nil {
		c.Tenants, _ = NewTenantQuotas(nil) // no store: cannot fail
	}
	c.Tenants.reload()
	return c
}

// reload replaces the quotas with what the store holds; where it cannot be
// read, those in memory stay in force, and the failure is logged.
func (q *TenantQuotas) reload() {
	if q.store == nil {
		return
	}
	m, err := q.store.Load()
	for t, b := range m {
		err = errors.Join(err, checkQuota(t, b))
	}
	if err != nil {
		slog.Warn("master: tenant quotas not reloaded; those in memory stay in force", "err", err)
		return
	}
	q.mu.Lock()
	q.quotas = m
	q.gen++
	q.mu.Unlock()
}

func checkQuota(t string, b uint64) error {
	if err := CheckTenant(t); err != nil {
		return err
	}
	if b < 1 || b > MaxTenantQuota {
		return fmt.Errorf("master: quota %d of tenant %q is outside [1, 2^63-1] bytes", b, t)
	}
	return nil
}

// Quota returns tenant t's quota; ok is false when it has none.
func (q *TenantQuotas) Quota(t string) (bytes uint64, ok bool) {
	bytes, _, ok = q.quota(t)
	return bytes, ok
}

// quota is Quota with the generation of the quotas it read.
func (q *TenantQuotas) quota(t string) (bytes, gen uint64, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	bytes, ok = q.quotas[t]
	return bytes, q.gen, ok
}

// All returns every quota, by tenant.
func (q *TenantQuotas) All() map[string]uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.quotas)
}

// Set gives tenant t a quota of bytes, stored before it takes effect.
// Objects already over it stay; the tenant's next puts evict them first.
func (q *TenantQuotas) Set(t string, bytes uint64) error {
	if err := checkQuota(t, bytes); err != nil {
		return err
	}
	return q.update(func(m map[string]uint64) { m[t] = bytes })
}

// Delete lifts tenant t's quota; it reports whether there was one.
func (q *TenantQuotas) Delete(t string) (bool, error) {
	if err := CheckTenant(t); err != nil {
		return false, err
	}
	_, had := q.Quota(t)
	return had, q.update(func(m map[string]uint64) { delete(m, t) })
}

// update applies f to a copy of the quotas, stores it, then keeps it: a
// quota the store did not take is not in force either.
func (q *TenantQuotas) update(f func(map[string]uint64)) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	m := maps.Clone(q.quotas)
	f(m)
	if q.store != nil {
		if err := q.store.Save(m); err != nil {
			return fmt.Errorf("%w: %w", errQuotaStore, err)
		}
	}
	q.quotas = m
	q.gen++
	return nil
}

func (q *TenantQuotas) count(m map[string]uint64, t string, n uint64) {
	q.mu.Lock()
	m[t] += n
	q.mu.Unlock()
}

// tenantLedger is a Service's admission state: per tenant with a quota, a
// lock that orders its admissions and a bound on what it is charged.
type tenantLedger struct {
	mu sync.Mutex
	// locks serialise each tenant's admissions, so that two puts never
	// both fit in the same room.
	locks map[string]*sync.Mutex
	// charged bounds from above the tenant's charge: its exact count
	// (chargeOf) at some point, plus what was admitted and what grew
	// since. Frees do not lower it; an admission that does not fit it
	// counts again. It holds for the quotas of one generation only: puts
	// admitted without a quota were not added.
	charged map[string]ledgerEntry
	// grown is, per tenant, the DRAM its objects ever gained outside
	// admissions (promotions from SSD): an entry taken when it was g
	// bounds the charge with what grew since added.
	grown map[string]uint64
}

type ledgerEntry struct{ n, gen, grown uint64 }

// initLocked makes the maps; l.mu is held.
func (l *tenantLedger) initLocked() {
	if l.locks == nil {
		l.locks, l.charged, l.grown = map[string]*sync.Mutex{}, map[string]ledgerEntry{}, map[string]uint64{}
	}
}

func (l *tenantLedger) lock(t string) *sync.Mutex {
	l.mu.Lock()
	l.initLocked()
	m := l.locks[t]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[t] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m
}

// get returns the bound on t's charge for the quotas of generation gen,
// and t's growth it includes; ok is false when there is none (a new term,
// or quotas changed).
func (l *tenantLedger) get(t string, gen uint64) (n, grown uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.charged[t]
	g := l.grown[t]
	return e.n + (g - e.grown), g, ok && e.gen == gen
}

// growth is t's growth so far; a count taken after it covers it.
func (l *tenantLedger) growth(t string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grown[t]
}

// set records n, which covers t's growth up to grown, as the bound on t's
// charge.
func (l *tenantLedger) set(t string, n, gen, grown uint64) {
	l.mu.Lock()
	l.charged[t] = ledgerEntry{n, gen, grown}
	l.mu.Unlock()
}

// grow adds n bytes of DRAM that key's tenant gained without an
// admission to the bound on its charge.
func (l *tenantLedger) grow(key string, n uint64) {
	t := tenantOfKey(key)
	l.mu.Lock()
	l.initLocked()
	l.grown[t] += n
	l.mu.Unlock()
}

// admitTenant admits a put of need bytes (all replicas) of key's tenant
// against its quota, evicting the tenant's own objects if it must; the put
// runs before the returned func, which lets the tenant's next put in.
func (s *Service) admitTenant(ctx context.Context, key string, need uint64) (func(), error) {
	t := tenantOfKey(key)
	quota, gen, ok := s.cfg.Tenants.quota(t)
	if !ok {
		return func() {}, nil
	}
	m := s.tenants.lock(t)
	charged, grown, known := s.tenants.get(t, gen)
	if !known || charged+need > quota {
		grown = s.tenants.growth(t) // before the count, which then covers it
		charged = s.chargeOf(t)
		if charged+need > quota && need <= quota {
			if s.evictTenant(t, charged+need-quota) > 0 {
				charged = s.chargeOf(t)
				if s.j != nil {
					// The room comes back once the drops are durable; the
					// put must not find the pool full before and evict
					// other tenants' objects for room that is the tenant's.
					_ = s.durable(ctx, s.j.last())
				}
			}
		}
		if charged+need > quota {
			s.tenants.set(t, charged, gen, grown)
			m.Unlock()
			s.cfg.Tenants.count(s.cfg.Tenants.rejects, t, 1)
			return nil, storeErr(storepb.TenantQuotaExceeded,
				"tenant %q: a put of %d bytes (all replicas) would take it over its quota of %d bytes (%d bytes charged)",
				t, need, quota, charged)
		}
	}
	s.tenants.set(t, charged+need, gen, grown)
	return m.Unlock, nil
}

// ownedBy reports whether the Service key sk is tenant t's, without
// splitting it.
func ownedBy(sk, t string) bool {
	if t == DefaultTenant {
		return sk == "" || sk[0] != 0 || strings.HasPrefix(sk, "\x00\x00")
	}
	return len(sk) > len(t)+1 && sk[0] == 0 && sk[len(t)+1] == 0 && sk[1:len(t)+1] == t
}

// chargeOf counts tenant t's DRAM bytes: the DRAM replicas of its readable
// objects and of its puts in flight.
func (s *Service) chargeOf(t string) uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for sk, o := range sh.objects {
			if !ownedBy(sk, t) {
				continue
			}
			n += charge(o)
		}
		sh.mu.Unlock()
	}
	return n
}

// charge is what o costs its tenant: its DRAM replicas, readable and of
// the put in flight.
func charge(o *object) uint64 {
	n := dramBytes(o)
	if o.pending != nil {
		for _, r := range o.pending.replicas {
			if !r.onDisk() {
				n += r.size
			}
		}
	}
	return n
}

// evictTenant evicts tenant t's oldest evictable objects (as Evict would
// take them: no lease, pin or put in flight; running soft pins last) until
// want bytes of DRAM are freed, and returns the bytes freed. Other
// tenants' objects are never touched.
func (s *Service) evictTenant(t string, want uint64) uint64 {
	now := s.now()
	var cands []candidate
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for sk, o := range sh.objects {
			if ownedBy(sk, t) && evictable(o, now, false) {
				cands = append(cands, candidate{sh: sh, key: sk, o: o, lease: stamp(o.lease),
					soft: o.softPinUntil.After(now)})
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(cands, byLease)
	var freed uint64
	for pass := range 2 {
		for _, c := range cands {
			if freed >= want {
				break
			}
			if c.soft != (pass == 1) {
				continue
			}
			c.sh.mu.Lock()
			if c.sh.objects[c.key] == c.o && evictable(c.o, now, false) {
				// Forced: the room is wanted now, not after a spill.
				freed += s.evictLocked(c.sh, c.key, c.o, true)
			}
			c.sh.mu.Unlock()
		}
	}
	if freed > 0 {
		s.cfg.Tenants.count(s.cfg.Tenants.evicted, t, freed)
	}
	return freed
}

// TenantUsage is one tenant's quota and charge, as the admin endpoints and
// metrics report them.
type TenantUsage struct {
	Tenant       string `json:"tenant_id"`
	Quota        uint64 `json:"quota_bytes"` // 0: none
	Charged      uint64 `json:"charged_bytes"`
	Keys         int    `json:"key_count"`
	OverQuota    bool   `json:"over_quota"`
	Rejects      uint64 `json:"reject_count"`
	EvictedBytes uint64 `json:"evicted_bytes"`
}

// TenantUsage reports every tenant that has a quota or objects, sorted.
func (s *Service) TenantUsage() []TenantUsage {
	q := s.cfg.Tenants
	q.mu.Lock()
	by := map[string]*TenantUsage{}
	get := func(t string) *TenantUsage {
		u := by[t]
		if u == nil {
			u = &TenantUsage{Tenant: t}
			by[t] = u
		}
		return u
	}
	for t, b := range q.quotas {
		get(t).Quota = b
	}
	for t, n := range q.rejects {
		get(t).Rejects = n
	}
	for t, n := range q.evicted {
		get(t).EvictedBytes = n
	}
	q.mu.Unlock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for sk, o := range sh.objects {
			u := get(tenantOfKey(sk))
			u.Charged += charge(o)
			if o.complete() {
				u.Keys++
			}
		}
		sh.mu.Unlock()
	}
	out := make([]TenantUsage, 0, len(by))
	for _, u := range by {
		u.OverQuota = u.Quota > 0 && u.Charged > u.Quota
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

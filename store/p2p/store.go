package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/etcdopt"
)

// Store is one node of the P2P store: a seed for the objects it registers
// and a receiver, then a source, for the objects it fetches. All methods
// are safe for concurrent use.
type Store struct {
	cfg        Config
	log        *slog.Logger
	e          *engine.Engine
	ownsEngine bool
	name       string // the engine's segment name, published in locations
	meta       *meta
	mem        *memory

	ctx    context.Context // cancelled by Close: calls in progress stop
	cancel context.CancelFunc
	calls  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	catalog map[string]*entry // names this node serves or is opening

	closeOnce sync.Once
	closeErr  error

	// afterShard, when set by a test, runs after shard i of a GetReplica
	// has arrived, before the worker takes the next one.
	afterShard func(i int)
	// afterPublish, when set by a test, runs after a GetReplica has
	// published itself as a source of the shards in batch.
	afterPublish func(batch []int)
	// onSeedRead, when set by a test, runs as a GetReplica starts reading
	// shard i from a seed; beforeClaim as it is about to claim shard i.
	onSeedRead, beforeClaim func(i int)
}

// entry is an object this Store holds. An entry exists from the start of
// the call that opens it; ready is set once the object is fully in place
// and cleared while a call takes it down.
type entry struct {
	gold   bool   // registered here (seed) rather than fetched (replica)
	ready  bool   // opened and not being closed
	chunks []span // memory registered for it
}

// PayloadInfo describes a published object.
type PayloadInfo struct {
	Name         string   // the object's name, its key without the prefix
	MaxShardSize uint64   // the largest shard, as the seed asked
	TotalSize    uint64   // bytes in the object
	SizeList     []uint64 // how the seed's buffers split the object
}

// New starts a Store: it connects to etcd and starts an engine unless
// cfg.Engine is given.
func New(ctx context.Context, cfg Config) (s *Store, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s = &Store{cfg: cfg, log: cfg.Logger.With("component", "p2p"), e: cfg.Engine, catalog: map[string]*entry{}}
	if s.e == nil {
		// An attempt at a shard runs up to Timeout; the engine bounds
		// every request by its own timeout too, which must not be shorter.
		// (Zero is the engine's default: MC_TRANSFER_TIMEOUT, else 30 s.)
		ecfg := cfg.EngineConfig
		if cfg.Timeout > ecfg.Timeout && (ecfg.Timeout != 0 || cfg.Timeout > 30*time.Second) {
			ecfg.Timeout = cfg.Timeout
		}
		if s.e, err = engine.New(ctx, ecfg); err != nil {
			return nil, fmt.Errorf("%w: start: %w", ErrTransferEngine, err)
		}
		s.ownsEngine = true
		e := s.e
		defer func() {
			if err != nil {
				e.Close()
			}
		}()
	}
	s.name = s.e.Name()
	s.mem = newMemory(s.e)
	cli, err := clientv3.New(etcdopt.Config(metadata.EtcdEndpoints(cfg.Metadata), cfg.Timeout))
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %w", ErrMetadata, cfg.Metadata, err)
	}
	// The client dials lazily; one read now reports an unreachable cluster
	// here rather than at the first Register.
	mctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if _, err := cli.Get(mctx, keyPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: connect %s: %w", ErrMetadata, cfg.Metadata, err)
	}
	s.meta = &meta{cli: cli}
	if err := s.meta.forget(mctx, s.name); err != nil {
		cli.Close()
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.log.Info("p2p store started", "segment", s.name, "metadata", cfg.Metadata)
	return s, nil
}

// LocalServerName is the segment name this node publishes as the source of
// what it serves.
func (s *Store) LocalServerName() string { return s.name }

// Engine is the Transfer Engine the Store moves bytes with; buffers from
// its AllocateBuffer can be given to Register and GetReplica.
func (s *Store) Engine() *engine.Engine { return s.e }

// Close withdraws this node from the metadata (gold copies and replicas,
// as Unregister and DeleteReplica would, within one Timeout), unregisters
// its memory, closes the engine if the Store started it and disconnects
// from etcd. Calls in progress are cancelled first and waited for. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		s.calls.Wait()

		var errs []error
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		names := make([]string, 0, len(s.catalog))
		for name := range s.catalog {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			ent := s.catalog[name]
			if err := s.withdraw(ctx, name, ent.gold); err != nil {
				errs = append(errs, err)
			}
			if err := s.mem.remove(ent.chunks); err != nil {
				errs = append(errs, err)
			}
		}
		cancel()
		clear(s.catalog)
		if s.ownsEngine {
			if err := s.e.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%w: close: %w", ErrTransferEngine, err))
			}
		}
		if err := s.meta.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("%w: close: %w", ErrMetadata, err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// enter admits a call: it fails once Close has begun, and the returned
// context ends with ctx or with Close. done must be called when the call
// returns.
func (s *Store) enter(ctx context.Context) (context.Context, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	s.calls.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
		s.calls.Done()
	}, nil
}

// metaCtx bounds one metadata exchange by Timeout.
func (s *Store) metaCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// reserve claims name for an opening call; release gives it back if that
// call fails, open marks it in place.
func (s *Store) reserve(name string, gold bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.catalog[name]; ok {
		return fmt.Errorf("%w: %q is already opened on this node", ErrPayloadOpened, name)
	}
	s.catalog[name] = &entry{gold: gold}
	return nil
}

func (s *Store) release(name string) {
	s.mu.Lock()
	delete(s.catalog, name)
	s.mu.Unlock()
}

func (s *Store) open(name string, chunks []span) {
	s.mu.Lock()
	ent := s.catalog[name]
	ent.chunks, ent.ready = chunks, true
	s.mu.Unlock()
}

// take claims an opened entry for a closing call, which ends with drop
// (done) or reopen (failed, the entry stays).
func (s *Store) take(name string, gold bool) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ent, ok := s.catalog[name]
	if !ok || !ent.ready || ent.gold != gold {
		role := "a replica"
		if gold {
			role = "registered"
		}
		return nil, fmt.Errorf("%w: %q is not %s on this node", ErrPayloadNotOpened, name, role)
	}
	ent.ready = false
	return ent, nil
}

func (s *Store) reopen(name string) {
	s.mu.Lock()
	s.catalog[name].ready = true
	s.mu.Unlock()
}

// checkBuffers turns parallel address and size lists into spans and their
// total size.
func checkBuffers(addrs []uintptr, sizes []uint64) ([]span, uint64, error) {
	if len(addrs) == 0 || len(addrs) != len(sizes) {
		return nil, 0, fmt.Errorf("%w: %d addresses and %d sizes", ErrInvalidArgument, len(addrs), len(sizes))
	}
	bufs := make([]span, len(addrs))
	var total, carry uint64
	for i, a := range addrs {
		b := span{uint64(a), sizes[i]}
		if b.addr == 0 || b.size == 0 || b.end() < b.addr {
			return nil, 0, fmt.Errorf("%w: buffer %d is %#x+%d", ErrInvalidArgument, i, b.addr, b.size)
		}
		if total, carry = bits.Add64(total, b.size, 0); carry != 0 {
			return nil, 0, fmt.Errorf("%w: buffer sizes overflow", ErrInvalidArgument)
		}
		bufs[i] = b
	}
	return bufs, total, nil
}

// Register publishes the object name made of the local buffers (addrs[i],
// sizes[i]) in order, cut into shards of at most maxShardSize (zero:
// DefaultMaxShardSize) that never cross a buffer. The buffers are
// registered with the engine, remote-accessible, at memLocation (the
// engine's location name of that memory; "": "cpu:0"),
// and must stay valid and unchanged until Unregister or Close. No bytes
// move: receivers pull them. Without forceCreate an existing object of that
// name is an error (ErrPayloadOpened); with it the object is replaced, and
// its replicas forgotten.
func (s *Store) Register(ctx context.Context, name string, addrs []uintptr, sizes []uint64, maxShardSize uint64, memLocation string, forceCreate bool) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	bufs, total, err := checkBuffers(addrs, sizes)
	if err != nil {
		return err
	}
	if maxShardSize == 0 {
		maxShardSize = DefaultMaxShardSize
	}
	if memLocation == "" {
		memLocation = "cpu:0"
	}
	if err := s.reserve(name, true); err != nil {
		return err
	}
	chunks, err := s.mem.add(bufs, memLocation)
	if err != nil {
		s.release(name)
		return err
	}
	p := &payload{Name: name, Size: total, SizeList: slices.Clone(sizes), MaxShardSize: maxShardSize}
	// Shards are cut within chunks, so every shard is one registered range
	// at the seed and one READ for a receiver whose buffers line up.
	for _, c := range chunks {
		for off := uint64(0); off < c.size; off += maxShardSize {
			p.Shards = append(p.Shards, shard{
				Size: min(maxShardSize, c.size-off),
				Gold: []location{{SegmentName: s.name, Offset: c.addr + off}},
			})
		}
	}
	mctx, cancel := s.metaCtx(ctx)
	defer cancel()
	if forceCreate {
		err = s.meta.put(mctx, p)
	} else {
		var created bool
		if created, err = s.meta.create(mctx, p); err == nil && !created {
			err = fmt.Errorf("%w: %q already exists in the metadata", ErrPayloadOpened, name)
		}
	}
	if err != nil {
		s.mem.remove(chunks)
		s.release(name)
		return err
	}
	s.open(name, chunks)
	s.log.Debug("registered", "name", name, "size", total, "shards", len(p.Shards))
	return nil
}

// Unregister withdraws this node's gold copies of name. The object stays
// published while replicas serve it; once nobody does, it is deleted. The
// buffers are unregistered (after transfers reading them finish) and
// belong to the caller again.
func (s *Store) Unregister(ctx context.Context, name string) error {
	return s.close(ctx, name, true)
}

// DeleteReplica withdraws this node from the replica lists of name and
// releases the buffers GetReplica filled. An object nobody serves any more
// is deleted.
func (s *Store) DeleteReplica(ctx context.Context, name string) error {
	return s.close(ctx, name, false)
}

func (s *Store) close(ctx context.Context, name string, gold bool) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	ent, err := s.take(name, gold)
	if err != nil {
		return err
	}
	if err := s.withdraw(ctx, name, gold); err != nil {
		s.reopen(name)
		return err
	}
	// Metadata first: no new receiver picks this node once it is gone,
	// and those already reading finish before the memory goes.
	err = s.mem.remove(ent.chunks)
	s.release(name)
	return err
}

// withdraw removes this node's locations of one role from name.
func (s *Store) withdraw(ctx context.Context, name string, gold bool) error {
	mctx, cancel := s.metaCtx(ctx)
	defer cancel()
	_, err := s.meta.edit(mctx, name, func(r *record) (bool, error) {
		changed := false
		for i := range r.p.Shards {
			sh := &r.p.Shards[i]
			list := &sh.ReplicaList
			if gold {
				list = &sh.Gold
			}
			n := len(*list)
			*list = withoutSegment(*list, s.name)
			changed = changed || len(*list) != n
		}
		return changed, nil
	})
	return err
}

// List describes the published objects whose names start with prefix, in
// name order. Records that are not valid payloads are skipped.
func (s *Store) List(ctx context.Context, prefix string) ([]PayloadInfo, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	mctx, cancel := s.metaCtx(ctx)
	defer cancel()
	ps, err := s.meta.list(mctx, prefix, func(key string, err error) {
		s.log.Warn("skipping invalid payload", "key", key, "err", err)
	})
	if err != nil {
		return nil, err
	}
	infos := make([]PayloadInfo, len(ps))
	for i, p := range ps {
		infos[i] = PayloadInfo{Name: p.Name, MaxShardSize: p.MaxShardSize, TotalSize: p.Size, SizeList: p.SizeList}
	}
	return infos, nil
}

// deadline is the end of one attempt at a shard: Timeout from now, or
// earlier if ctx ends earlier.
func (s *Store) deadline(ctx context.Context) time.Time {
	d := time.Now().Add(s.cfg.Timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

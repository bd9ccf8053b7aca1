package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Client is a Mooncake Store client: it contributes a segment of DRAM to
// the pool, and puts and gets objects, moving bytes with the Transfer
// Engine and metadata with the master. It is safe for concurrent use.
type Client struct {
	cfg     Config
	id      string
	eng     *engine.Engine
	ownsEng bool
	name    string // the engine's segment name: replicas here are local
	host    string // the engine's host: replicas there are same-host
	log     *slog.Logger
	master  *masterConn
	stage   *stage

	segBuf *engine.Buffer   // nil for NoSegment
	ssd    *ssdTier         // nil without an SSD tier
	seg    *storepb.Segment // what is mounted
	segs   *segmentCache    // opened peers
	regs   registrations    // caller memory registered with the engine
	leases *leaseCache      // nil with NoLeaseCache
	puts   putSessions      // open put sessions (put_session.go)
	slots  slotPool         // space reserved for the next puts (put_slots.go)
	met    *metrics

	stop   context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
	cerr   error

	// gate is read-held by every put and get in progress, which use the
	// staging buffer, the segment and the engine; Close takes it to wait
	// them out, and sets shut so that later ones fail.
	gate sync.RWMutex
	shut bool
}

// ErrClosed is the cause of the InvalidParams error of a call on a closed
// client: errors.Is(err, ErrClosed) tells it from a bad argument.
var ErrClosed = errors.New("client closed")

// enter admits a put or get, or returns the error it fails with once the
// client is closed; a nil error must be followed by leave.
func (c *Client) enter() error {
	c.gate.RLock()
	if c.shut {
		c.gate.RUnlock()
		return &storepb.Error{Code: storepb.InvalidParams, Err: ErrClosed}
	}
	return nil
}

func (c *Client) leave() { c.gate.RUnlock() }

// New starts a client: it starts (or adopts) an engine, allocates the
// staging buffer and the segment, mounts the segment with the master and
// starts the heartbeat. A failure halfway undoes what was done.
func New(ctx context.Context, cfg Config) (c *Client, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ClusterID = cmp.Or(cfg.ClusterID, os.Getenv("MC_STORE_CLUSTER_ID"), DefaultClusterID)
	if cfg.TenantID, err = tenantOf(cfg.TenantID); err != nil {
		return nil, err
	}
	if v := os.Getenv("MC_STORE_AUTO_SLOTS"); v == "0" || strings.EqualFold(v, "false") {
		cfg.NoAutoSlots = true
	}
	cfg.SegmentSize = cmp.Or(cfg.SegmentSize, DefaultSegmentSize)
	cfg.LocalBufferSize = cmp.Or(cfg.LocalBufferSize, DefaultLocalBufferSize)
	cfg.RPCTimeout = cmp.Or(cfg.RPCTimeout, DefaultRPCTimeout)
	cfg.PingInterval = cmp.Or(cfg.PingInterval, DefaultPingInterval)
	cfg.ID = cmp.Or(cfg.ID, uuid.NewString())
	cfg.LeaseCache = cmp.Or(cfg.LeaseCache, 1<<16)
	c = &Client{cfg: cfg, id: cfg.ID, eng: cfg.Engine, log: slog.Default().With("client", cfg.ID)}
	// undo's steps go through self: the failing return has already set c
	// to nil.
	self := c
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()
	if c.eng == nil {
		if c.eng, err = engine.New(ctx, cfg.EngineConfig); err != nil {
			return nil, fmt.Errorf("client: engine: %w", err)
		}
		c.ownsEng = true
		undo = append(undo, func() { _ = self.eng.Close() })
	}
	c.name, c.host = c.eng.Name(), c.eng.Host()
	c.segs = newSegmentCache(c.eng)
	c.met = newMetrics(cfg.Registerer)
	if cfg.LeaseCache > 0 {
		c.leases = newLeaseCache(cfg.LeaseCache)
	}
	undo = append(undo, self.segs.closeAll)
	if c.stage, err = newStage(ctx, c.eng, cfg.LocalBufferSize); err != nil {
		return nil, fmt.Errorf("client: local buffer of %d bytes: %w", cfg.LocalBufferSize, err)
	}
	undo = append(undo, func() { _ = self.stage.free() })
	if c.master, err = dialMaster(ctx, &c.cfg); err != nil {
		return nil, err
	}
	undo = append(undo, self.master.close)
	if cfg.SegmentSize > 0 {
		if c.segBuf, err = c.eng.AllocateBuffer(ctx, int(cfg.SegmentSize), ""); err != nil {
			return nil, fmt.Errorf("client: segment of %d bytes: %w", cfg.SegmentSize, err)
		}
		undo = append(undo, func() { _ = self.segBuf.Free() })
		if !cfg.NoPrefault {
			prefault(c.segBuf.Bytes())
		}
		c.seg = &storepb.Segment{
			Id: uuid.NewString(), Name: c.name, Base: uint64(c.segBuf.Addr()), Size: uint64(cfg.SegmentSize),
			TransportEndpoint: c.name, Protocol: "tcp", HostId: c.host,
		}
	}
	if cfg.SSDDir != "" {
		if c.ssd, err = openSSD(ctx, c.eng, cfg.SSDDir, cfg.SSDSize, c.name, c.host, c.log); err != nil {
			c.log.Warn("store: no SSD tier", "dir", cfg.SSDDir, "err", err)
			c.ssd, err = nil, nil
		} else {
			undo = append(undo, func() { _ = self.ssd.close(self.eng) })
			c.ssd.onFail = c.retireSSD
		}
	}
	// ReMountSegment registers the client even without a segment, so the
	// master knows it before its first ping.
	if err = c.remount(ctx, false); err != nil {
		return nil, fmt.Errorf("client: mount: %w", err)
	}
	hctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.slots.init(hctx, !c.cfg.ReservePuts)
	c.wg.Add(1)
	go c.heartbeat(hctx)
	return c, nil
}

func (c *Client) segments() []*storepb.Segment {
	var out []*storepb.Segment
	if c.seg != nil {
		out = append(out, c.seg)
	}
	if c.ssd != nil && c.ssd.failed() == nil {
		out = append(out, c.ssd.seg) // a failed tier is not mounted again
	}
	return out
}

// remount mounts the client's segments, again (told to) or for the first
// time.
func (c *Client) remount(ctx context.Context, again bool) error {
	segs := c.segments()
	ssd := c.ssd != nil && c.ssd.failed() == nil
	if ssd {
		segs = segs[:len(segs)-1] // the tier mounts with its objects (mountSSD)
	}
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
		r, err := rpc.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: c.id, Segments: segs, Again: again})
		if err != nil {
			return err
		}
		return r.AsError()
	})
	if err != nil || !ssd {
		return err
	}
	return c.mountSSD(ctx, again)
}

// heartbeat pings the master every PingInterval and remounts when the
// master does not know the client (it restarted, failed over, or expired
// the client after a long pause).
func (c *Client) heartbeat(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTimer(c.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(c.cfg.PingInterval)
		var st storepb.ClientStatus
		var tasks []*storepb.MoveTask
		err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
			pctx, cancel := context.WithTimeout(ctx, c.cfg.PingInterval*3)
			defer cancel()
			r, err := rpc.Ping(pctx, &storepb.PingRequest{ClientId: c.id})
			if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
				return fmt.Errorf("%w: ping: %w", errNoAnswer, err)
			}
			if err != nil {
				return err
			}
			st, tasks = r.ClientStatus, r.Tasks
			return r.Result.AsError()
		})
		c.unmountSSD(ctx) // a failed tier the master could not be told of
		if err == nil {
			c.revokeStale(ctx)
			c.giveBackLost(ctx)
		}
		if len(tasks) > 0 {
			c.runMoves(ctx, tasks)
			// More may be queued: ask again at once.
			t.Reset(0)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("store: ping failed", "err", err)
		case st == storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT:
			c.log.Info("store: master asks for a remount")
			c.forgetSlots()
			if err := c.remount(ctx, true); err != nil && ctx.Err() == nil {
				c.log.Warn("store: remount failed", "err", err)
			}
		}
	}
}

// ID is the client's id at the master.
func (c *Client) ID() string { return c.id }

// SegmentName is the Transfer Engine segment name of this client, which
// names its mounted segment.
func (c *Client) SegmentName() string { return c.name }

// Engine is the Transfer Engine the client moves bytes with.
func (c *Client) Engine() *engine.Engine { return c.eng }

// Close unmounts the segment (its replicas leave the pool), stops the
// heartbeat and frees what New allocated; it closes the engine if New
// started it. It is idempotent.
func (c *Client) Close() error {
	c.closed.Do(func() {
		c.gate.Lock() // the puts and gets in progress finish first
		c.shut = true
		c.gate.Unlock()
		// Reserves on the wire end first (bounded), so that their slots
		// are given back below: the master makes a reserve's slots even
		// when its caller stopped waiting, and would hold them until
		// PutStartReleaseTimeout.
		reserved := make(chan struct{})
		go func() { c.slots.wg.Wait(); close(reserved) }()
		select {
		case <-reserved:
		case <-time.After(5 * time.Second):
		}
		c.stop()
		c.wg.Wait()
		c.slots.wg.Wait()
		// Sessions never ended, slots never used and those of reserves
		// without an answer give their space back now rather than when the
		// master reclaims stale starts.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if keys := append(c.puts.keys(), c.dropSlots()...); len(keys) > 0 {
			_ = c.revoke(ctx, keys)
		}
		c.revokeLost(ctx, c.slots.takeLost())
		cancel()
		var errs []error
		for _, seg := range c.segments() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
				r, err := rpc.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: c.id, SegmentId: seg.Id})
				if err != nil {
					return err
				}
				return r.AsError()
			})
			cancel()
			if err != nil && !errors.Is(err, storepb.ErrSegmentNotFound) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", seg.Id, err))
			}
		}
		c.master.close()
		c.segs.closeAll()
		c.regs.unregisterAll(c.eng)
		if c.segBuf != nil {
			errs = append(errs, c.segBuf.Free())
		}
		if c.ssd != nil {
			errs = append(errs, c.ssd.close(c.eng))
		}
		errs = append(errs, c.stage.free())
		if c.ownsEng {
			errs = append(errs, c.eng.Close())
		}
		c.cerr = errors.Join(errs...)
	})
	return c.cerr
}

// sameHost reports whether a replica's engine runs on this client's host,
// judged by the host part of its endpoint.
func (c *Client) sameHost(endpoint string) bool {
	h, _, err := net.SplitHostPort(endpoint)
	return err == nil && h == c.host
}

// prefault backs every page of a segment with memory now, so puts do not
// pay page faults (and zeroing) on first touch, and an overcommitted host
// fails at mount rather than in the data path. Kernels without
// MADV_POPULATE_WRITE get each page touched instead.
func prefault(b []byte) {
	if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err == nil {
		return
	}
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 0
	}
}

// fill is n copies of err, the per-key errors of a batch failed as a whole.
func fill(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

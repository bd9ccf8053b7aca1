package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// ssdTier is the client's SSD tier: a preallocated file in Config.SSDDir,
// mapped shared and registered with the engine, mounted as a segment of
// medium DISK. The master spills evicted objects into it and promotes
// them back on a hit (see store/master's tier story); the client does the
// copies it is given in ping answers.
//
// The file outlives the process: it is mooncake-ssd-<n>.seg in SSDDir, the
// first n no other live process holds (flock), with its index beside it
// (ssd_index.go). A client restarted on the directory maps the file again,
// checks each object the index lists against its checksum (a damaged one
// is logged and dropped, never served) and mounts the tier with the rest,
// which the master takes back into the pool (store/master MountDisk).
//
// A failing disk shows through the mapping: a page that cannot be read in
// faults the process (SIGBUS), a page that cannot be written back fails
// the next fdatasync. Copies in this process that touch the mapping therefore
// turn a fault into an error (copy), moves into the tier are synced
// before they are reported done (flush), and the first I/O error retires
// the tier: it is unmounted at the master, whose sweep drops every replica
// on it (objects also in DRAM keep those; the others are lost, never
// served wrong), and it is not mounted again. Reads by peers go through
// the engine's server, whose socket writes fail with EFAULT on such a
// page: the peer sees a failed transfer, not a crash.
type ssdTier struct {
	f     *os.File
	mem   []byte
	seg   *storepb.Segment
	index *ssdIndex

	// onFail is told of the tier's first I/O error (set by the client).
	onFail    func(error)
	failErr   atomic.Pointer[error] // the first I/O error; nil while healthy
	once      sync.Once
	unmounted atomic.Bool // failed, and unmounted at the master
}

// errSSD is the cause of every error of a failing SSD tier.
var errSSD = errors.New("SSD tier I/O error")

// holds reports whether b lies in the tier's mapping (false without one).
func (t *ssdTier) holds(b []byte) bool {
	if t == nil || len(b) == 0 {
		return false
	}
	a, base := engine.AddrOf(b), engine.AddrOf(t.mem)
	return a >= base && a+uintptr(len(b)) <= base+uintptr(len(t.mem))
}

// offset is where in the file the mapped address a lies.
func (t *ssdTier) offset(a uintptr) int64 { return int64(a - engine.AddrOf(t.mem)) }

// failed returns the tier's first I/O error, nil while it is healthy.
func (t *ssdTier) failed() error {
	if t == nil {
		return nil
	}
	if p := t.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records err as the tier's failure; the first one is passed on to
// onFail (once), later ones only returned. It returns err.
func (t *ssdTier) fail(err error) error {
	t.once.Do(func() {
		t.failErr.Store(&err)
		if t.onFail != nil {
			t.onFail(err)
		}
	})
	return err
}

// copy copies src to dst, either of which may lie in the tier's mapping
// (t may be nil: a plain copy). A page of the tier that cannot be paged
// in faults; the fault is caught and becomes the tier's failure instead
// of killing the process. A tier that has failed is not touched again.
func (t *ssdTier) copy(dst, src []byte) (err error) {
	in, out := t.holds(src), t.holds(dst)
	if !in && !out {
		copy(dst, src)
		return nil
	}
	if err := t.failed(); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			// Only a fault in the tier's mapping is the disk's; any other
			// goes on as the crash it was.
			f, ok := r.(interface{ Addr() uintptr })
			base := engine.AddrOf(t.mem)
			if !ok || f.Addr() < base || f.Addr() >= base+uintptr(len(t.mem)) {
				panic(r)
			}
			err = t.fail(fmt.Errorf("%w: %s at offset %d: a page of the file could not be read in from the disk",
				errSSD, t.f.Name(), t.offset(f.Addr())))
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	copy(dst, src)
	return nil
}

// flush writes what was copied into the tier through to the disk, so that
// a move is reported done only once its bytes are there: a page whose
// write-back fails would otherwise read back as the old bytes (or fault)
// once the kernel drops it, after the master freed the DRAM copy of a
// spill. One fdatasync covers a whole batch of moves.
func (t *ssdTier) flush() error {
	if err := t.failed(); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(t.f.Fd())); err != nil {
		return t.fail(fmt.Errorf("%w: fdatasync of %s: %v", errSSD, t.f.Name(), err))
	}
	return nil
}

// check reads b's bytes from the file (not the mapping), to tell whether
// a move from the tier that the engine failed failed on the disk: a read
// error fails the tier.
func (t *ssdTier) check(b []byte) error {
	if err := t.failed(); err != nil {
		return err
	}
	off := t.offset(engine.AddrOf(b))
	buf := make([]byte, min(len(b), 1<<20))
	for n := 0; n < len(b); n += len(buf) {
		m := min(len(buf), len(b)-n)
		if _, err := t.f.ReadAt(buf[:m], off+int64(n)); err != nil {
			return t.fail(fmt.Errorf("%w: %w", errSSD, err))
		}
	}
	return nil
}

// ssdSlots bounds the tier files of one directory: a client takes the
// first one no other process holds.
const ssdSlots = 64

// lockSlot opens and locks (flock, released when the process goes) the
// first free tier file of dir.
func lockSlot(dir string) (*os.File, error) {
	for n := range ssdSlots {
		path := filepath.Join(dir, fmt.Sprintf("mooncake-ssd-%d.seg", n))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return nil, fmt.Errorf("all %d SSD tier files of %s are held by other processes", ssdSlots, dir)
}

// openSSD maps the tier, with the objects its file kept from an earlier
// run when it has the same size (checked: see ssdIndex.verify). The file
// is fallocated in full, so a disk that fills up later cannot fault a
// write into the mapping; where that fails the client runs without a
// tier, and the file is removed.
func openSSD(ctx context.Context, e *engine.Engine, dir string, size int64, name, host string, log *slog.Logger) (*ssdTier, error) {
	f, err := lockSlot(dir)
	if err != nil {
		return nil, err
	}
	idxPath := strings.TrimSuffix(f.Name(), ".seg") + ".idx"
	fail := func(err error) (*ssdTier, error) {
		_ = f.Close()
		_ = os.Remove(f.Name())
		_ = os.Remove(idxPath)
		return nil, err
	}
	idx, err := loadIndex(idxPath)
	if err != nil {
		return fail(fmt.Errorf("SSD tier index %s: %w", idxPath, err))
	}
	if st, err := f.Stat(); err != nil {
		return fail(err)
	} else if st.Size() != size {
		// A new file, or one of another size: nothing in it carries over.
		if err := f.Truncate(0); err != nil {
			return fail(err)
		}
		idx = newIndex(idxPath)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fail(fmt.Errorf("fallocate %d bytes in %s: %w", size, dir, err))
	}
	if n := len(idx.byOff); n > 0 {
		kept := idx.verify(f, size, log)
		log.Info("store: SSD tier file reopened", "path", f.Name(), "objects", n, "intact", kept)
	}
	if err := idx.rewrite(); err != nil {
		return fail(fmt.Errorf("SSD tier index %s: %w", idxPath, err))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		idx.close()
		return fail(fmt.Errorf("mmap %s: %w", f.Name(), err))
	}
	addr := engine.AddrOf(mem)
	if err := e.RegisterMemory(ctx, addr, uint64(size), "", true); err != nil {
		_ = unix.Munmap(mem)
		idx.close()
		return fail(err)
	}
	return &ssdTier{f: f, mem: mem, index: idx, seg: &storepb.Segment{
		Id: uuid.NewString(), Name: name, Base: uint64(addr), Size: uint64(size),
		TransportEndpoint: name, Protocol: "tcp", HostId: host, Medium: storepb.Medium_MEDIUM_DISK,
	}}, nil
}

// close unmaps the tier and lets the file go (its lock with it); the file
// and its index stay for the next run.
func (t *ssdTier) close(e *engine.Engine) error {
	err := e.UnregisterMemory(context.Background(), engine.AddrOf(t.mem))
	_ = unix.Munmap(t.mem)
	t.index.close()
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// retireSSD takes the failing tier out of the pool: the master drops its
// replicas (so none is handed to a reader again) and the client stops
// mounting it. Its mapping stays until Close, as the engine may still be
// serving a read of it.
func (c *Client) retireSSD(err error) {
	c.log.Error("store: SSD tier failing; unmounting it, the DRAM segment carries on", "path", c.ssd.f.Name(), "err", err)
	c.met.ssdFailed.Set(1)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
	defer cancel()
	c.unmountSSD(ctx)
}

// unmountSSD unmounts a failed tier at the master, unless done already;
// the heartbeat calls it again while the master cannot be reached.
func (c *Client) unmountSSD(ctx context.Context) {
	t := c.ssd
	if t == nil || t.failed() == nil || t.unmounted.Load() {
		return
	}
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
		r, err := rpc.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: c.id, SegmentId: t.seg.Id})
		if err != nil {
			return err
		}
		return r.AsError()
	})
	if err != nil && !errors.Is(err, storepb.ErrSegmentNotFound) {
		c.log.Warn("store: unmount of the failed SSD tier (retried)", "path", t.f.Name(), "err", err)
		return
	}
	t.unmounted.Store(true)
}

// Path is the tier's file ("" without a tier), for operators and tests.
func (c *Client) SSDPath() string {
	if c.ssd == nil {
		return ""
	}
	return c.ssd.f.Name()
}

// runMoves does the copies the master asked for and reports each. The
// source is in one of this client's segments; the target anywhere.
func (c *Client) runMoves(ctx context.Context, tasks []*storepb.MoveTask) {
	xs := make([]*xfer, len(tasks))
	for i, t := range tasks {
		src, dst := t.GetSource(), t.GetTarget()
		x := &xfer{op: engine.Write}
		xs[i] = x
		switch {
		case src == nil || dst == nil || src.Size == 0 || src.Size != dst.Size:
			x.err = fmt.Errorf("malformed move %d", t.Id)
			continue
		case src.SegmentName != c.name:
			x.err = fmt.Errorf("move %d: source on %s, not here", t.Id, src.SegmentName)
			continue
		}
		x.local = transport.Bytes(uintptr(src.BufferAddress), src.Size)
		if !c.registered(x.local) {
			x.err = fmt.Errorf("move %d: source %#x+%d outside this client's segments", t.Id, src.BufferAddress, src.Size)
			continue
		}
		x.seg, x.remote = dst.SegmentName, dst.BufferAddress
		if c.ssd.holds(x.local) {
			// A copy by the engine from a failed tier would fail too, or
			// read bytes a failed write-back left stale.
			x.err = c.ssd.failed()
		}
	}
	var run []*xfer
	for _, x := range xs {
		if x.err == nil {
			run = append(run, x)
		}
	}
	c.run(ctx, run, time.Time{})
	flushed, ferr := false, error(nil)
	for _, x := range run {
		switch into := transport.Bytes(uintptr(x.remote), uint64(len(x.local))); {
		case x.err == nil && x.seg == c.name && c.ssd.holds(into):
			if !flushed {
				flushed, ferr = true, c.ssd.flush()
			}
			x.err = ferr
		case x.err != nil && c.ssd.holds(x.local) && !errors.Is(x.err, errSSD):
			// The engine failed a copy out of the tier: if the disk is
			// why, the tier goes.
			_ = c.ssd.check(x.local)
		}
	}
	c.recordSSD(tasks, xs)
	for i, t := range tasks {
		ok := xs[i].err == nil
		if !ok {
			c.met.moveFailures.WithLabelValues(mediumName(t.GetTarget().GetMedium())).Inc()
			c.log.Warn("store: move failed", "key", t.Key, "target", t.GetTarget().GetMedium(), "err", xs[i].err)
		}
		err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
			r, err := rpc.MoveEnd(ctx, &storepb.MoveEndRequest{ClientId: c.id, TaskId: t.Id, Ok: ok})
			if err != nil {
				return err
			}
			return r.AsError()
		})
		if err != nil && ctx.Err() == nil {
			c.log.Debug("store: move not taken", "key", t.Key, "err", err)
		}
	}
}

// recordSSD adds the moves into the tier that succeeded to its index, so
// that a restart finds them. A failed index write loses them only for
// the restart: the moves stand.
func (c *Client) recordSSD(tasks []*storepb.MoveTask, xs []*xfer) {
	var recs []*storepb.DiskObject
	for i, t := range tasks {
		x := xs[i]
		into := transport.Bytes(uintptr(x.remote), uint64(len(x.local)))
		if x.err != nil || x.seg != c.name || !c.ssd.holds(into) {
			continue
		}
		// The source is the object's DRAM replica, copied exactly; its
		// sum is the one the bytes on disk must have.
		recs = append(recs, &storepb.DiskObject{Key: t.Key, Offset: uint64(c.ssd.offset(uintptr(x.remote))),
			Size: uint64(len(x.local)), Checksum: checksum(x.local)})
	}
	if len(recs) == 0 {
		return
	}
	if err := c.ssd.index.record(recs); err != nil {
		c.log.Warn("store: SSD tier index not written; these objects will not survive a restart", "path", c.ssd.index.path,
			"objects", len(recs), "err", err)
	}
}

// mediumName labels a move's target medium in metrics.
func mediumName(m storepb.Medium) string {
	if m == storepb.Medium_MEDIUM_DISK {
		return "disk"
	}
	return "dram"
}

package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// xfer is one copy between local memory and a replica.
type xfer struct {
	op     engine.Op
	local  []byte // registered memory, unless the replica is in this process and local is host memory
	seg    string // the replica's segment; the client's own means a local copy
	remote uint64
	crc    bool   // checksum the bytes once in place (reads to verify)
	sum    uint32 // their CRC-32C, with crc and no err
	err    error
}

// segmentCache remembers the segments the client opened, to close them on
// Close. The engine itself keeps one open segment per name, so opening is
// a map lookup after the first time; a failed transfer does not close the
// segment, which other transfers may be using (the engine redials).
type segmentCache struct {
	eng *engine.Engine
	mu  sync.Mutex
	ids map[engine.SegmentID]bool
}

func newSegmentCache(e *engine.Engine) *segmentCache {
	return &segmentCache{eng: e, ids: make(map[engine.SegmentID]bool)}
}

func (s *segmentCache) open(ctx context.Context, name string) (engine.SegmentID, error) {
	id, err := s.eng.OpenSegment(ctx, name)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.ids[id] = true
	s.mu.Unlock()
	return id, nil
}

func (s *segmentCache) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.ids {
		_ = s.eng.CloseSegment(id)
		delete(s.ids, id)
	}
}

// run performs xs, setting each one's err (and sum). Copies within this
// process are plain copies, unless the local memory is on a GPU: those go
// to the engine's local segment, whose copy the driver makes. The rest go
// to the engine as one batch, with the earlier of ctx's deadline and until
// (zero: none) on every request, never past the engine's timeout
// (MC_TRANSFER_TIMEOUT). Opening a peer's segment is bounded by until too:
// a handshake with a node cut off must not outlast the attempt. The engine
// checksums what it moves slice by slice as the slices land, overlapped
// with the rest of the transfer.
func (c *Client) run(ctx context.Context, xs []*xfer, until time.Time) {
	octx := ctx
	if !until.IsZero() {
		var cancel context.CancelFunc
		octx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	var remote []*xfer
	var reqs []engine.Request
	crc := false
	for _, x := range xs {
		id := engine.LocalSegment
		if x.seg == c.name {
			if _, gpu, _ := c.eng.MemoryLocation(engine.AddrOf(x.local), uint64(len(x.local))); !gpu {
				c.copyLocal(x)
				continue
			}
		} else {
			var err error
			if id, err = c.segs.open(octx, x.seg); err != nil {
				x.err = transferErr(err, "open segment %s", x.seg)
				continue
			}
		}
		crc = crc || x.crc
		remote = append(remote, x)
		reqs = append(reqs, engine.Request{Op: x.op, Local: engine.AddrOf(x.local), Segment: id,
			Remote: x.remote, Length: uint64(len(x.local))})
	}
	if len(reqs) == 0 {
		return
	}
	fail := func(err error) {
		for _, x := range remote {
			x.err = err
		}
	}
	b, err := c.eng.AllocateBatch(len(reqs))
	if err != nil {
		fail(transferErr(err, "allocate batch"))
		return
	}
	var opts []engine.SubmitOption
	if d, ok := ctx.Deadline(); ok && (until.IsZero() || d.Before(until)) {
		until = d
	}
	if !until.IsZero() {
		opts = append(opts, engine.WithDeadline(until))
	}
	if crc {
		opts = append(opts, engine.WithChecksum())
	}
	if err := c.eng.Submit(ctx, b, reqs, opts...); err != nil {
		_ = c.eng.FreeBatch(b)
		fail(transferErr(err, "submit"))
		return
	}
	// Every request has a deadline, so the batch ends without ctx; the
	// memory it touches must not be released before it does.
	_, _ = c.eng.Wait(context.Background(), b)
	for i, x := range remote {
		st, err := c.eng.TaskStatus(b, i)
		switch {
		case err != nil:
			x.err = transferErr(err, "task %d", i)
		case st.Status != engine.Completed:
			x.err = transferErr(st.Err, "%v %s %#x+%d", x.op, x.seg, x.remote, len(x.local))
		default:
			x.sum = st.Checksum
		}
	}
	_ = c.eng.FreeBatch(b)
}

// copyLocal performs x, between host memory and this client's segment
// (or its SSD tier, whose disk may fail under the copy: see ssdTier.copy).
func (c *Client) copyLocal(x *xfer) {
	dst := transport.Bytes(uintptr(x.remote), uint64(len(x.local)))
	if x.op == engine.Read {
		x.err = c.ssd.copy(x.local, dst)
	} else {
		x.err = c.ssd.copy(dst, x.local)
	}
	if x.err != nil {
		x.err = &storepb.Error{Code: storepb.TransferFail, Err: x.err}
		return
	}
	if x.crc {
		x.sum = crc32c.Checksum(x.local)
	}
}

// transferErr is a TransferFail caused by err (nil when there is none).
func transferErr(err error, format string, args ...any) error {
	return &storepb.Error{Code: storepb.TransferFail, Msg: fmt.Sprintf(format, args...), Err: err}
}

// registrations are caller buffers registered with the engine through
// RegisterBuffer; Put and Get use them without staging. Each keeps its
// slice, so Go memory stays allocated while the engine may touch it even if
// the caller drops its own reference.
type registrations struct {
	mu   sync.RWMutex
	list []registration // sorted by start
}

type registration struct {
	start, end uintptr
	buf        []byte
}

func (r *registrations) contains(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	a := engine.AddrOf(b)
	r.mu.RLock()
	defer r.mu.RUnlock()
	i, _ := slices.BinarySearchFunc(r.list, a, func(e registration, a uintptr) int {
		switch {
		case e.end <= a:
			return -1
		case e.start > a:
			return 1
		}
		return 0
	})
	return i < len(r.list) && r.list[i].start <= a && a+uintptr(len(b)) <= r.list[i].end
}

func (r *registrations) add(b []byte) {
	a := engine.AddrOf(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.list, a, func(e registration, a uintptr) int {
		return cmp.Compare(e.start, a)
	})
	r.list = slices.Insert(r.list, i, registration{start: a, end: a + uintptr(len(b)), buf: b})
}

func (r *registrations) remove(a uintptr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.list {
		if e.start == a {
			r.list = slices.Delete(r.list, i, i+1)
			return true
		}
	}
	return false
}

func (r *registrations) unregisterAll(e *engine.Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.list {
		_ = e.UnregisterMemory(context.Background(), x.start)
	}
	r.list = nil
}

// RegisterBuffer registers b with the engine so that Put and GetInto move
// bytes straight from and into it, without the staging copy (Mooncake's
// register_buffer). b must stay allocated and must not move until
// UnregisterBuffer: C memory, an mmap, or Go memory (the client holds b
// until UnregisterBuffer, and Go's collector does not move heap objects).
func (c *Client) RegisterBuffer(b []byte) error {
	if len(b) == 0 {
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "register an empty buffer"}
	}
	if err := c.eng.RegisterMemory(context.Background(), engine.AddrOf(b), uint64(len(b)), "", false); err != nil {
		return &storepb.Error{Code: storepb.InvalidParams, Err: err}
	}
	c.regs.add(b)
	return nil
}

// UnregisterBuffer undoes RegisterBuffer of the buffer starting at b[0].
func (c *Client) UnregisterBuffer(b []byte) error {
	if len(b) == 0 || !c.regs.remove(engine.AddrOf(b)) {
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "buffer is not registered"}
	}
	if err := c.eng.UnregisterMemory(context.Background(), engine.AddrOf(b)); err != nil {
		return &storepb.Error{Code: storepb.InvalidParams, Err: err}
	}
	return nil
}

// registered reports whether b can be handed to the engine as it is:
// memory registered by the caller, or part of the client's own segment or
// staging buffer.
func (c *Client) registered(b []byte) bool {
	if c.regs.contains(b) {
		return true
	}
	a, n := engine.AddrOf(b), uintptr(len(b))
	within := func(buf *engine.Buffer) bool {
		return buf != nil && a >= buf.Addr() && a+n <= buf.Addr()+uintptr(buf.Len())
	}
	if within(c.segBuf) || within(c.stage.buf) {
		return true
	}
	return c.ssd.holds(b)
}

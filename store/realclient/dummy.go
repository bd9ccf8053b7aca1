package realclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/store/alloc"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// ErrGone is the cause of every call of a Dummy after its real client
// hung up or died (or a call of it timed out, leaving the stream unusable):
// such calls fail at once with RPC_FAIL instead of waiting.
var ErrGone = errors.New("realclient: real client is gone")

// DefaultCallTimeout bounds a call of a Dummy whose context has no
// deadline, so that a real client that stops answering (stopped, not
// dead) cannot hang its dummies.
const DefaultCallTimeout = 2 * time.Minute

// PoolAlignment is the alignment of Dummy.Alloc's buffers (a page, as the
// official MooncakeHostMemAllocator's).
const PoolAlignment = 4096

// Dummy is a thin client: it holds no segment and no engine, and forwards
// every call to the real client on its host. Its memory (the pool that
// Alloc hands out, and a staging buffer) is shared with the real client,
// so a value in the pool moves without a copy and any other value with one
// copy, through the staging buffer. Calls are serialized on the one
// connection; Dummy is safe for concurrent use.
type Dummy struct {
	addr    string
	conn    *net.UnixConn
	timeout time.Duration

	mem      []byte // shared: the pool [0, poolSize), then the staging buffer
	poolSize uint64
	staging  []byte

	poolMu sync.Mutex
	pool   *alloc.Allocator // nil without a pool

	mu      sync.Mutex // one call at a time; guards the fields below
	buf     []byte
	broken  error
	closed  bool
	regions []region // memory of the caller's the real client has mapped too
}

// region is memory of the dummy's process that the real client mapped
// too (RegisterShared), under the number it gave it.
type region struct {
	id  uint32
	mem []byte
}

// Option adjusts a Dummy at Dial.
type Option func(*Dummy)

// WithCallTimeout bounds calls whose context has no deadline (zero:
// DefaultCallTimeout).
func WithCallTimeout(d time.Duration) Option {
	return func(x *Dummy) {
		if d > 0 {
			x.timeout = d
		}
	}
}

// Dial connects to the real client at addr (see SocketFor) and asks for
// poolSize bytes of pool and stagingSize bytes of staging buffer, both in
// memory shared with it.
func Dial(ctx context.Context, addr string, poolSize, stagingSize uint64, opts ...Option) (_ *Dummy, err error) {
	sock, err := SocketFor(addr)
	if err != nil {
		return nil, err
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, &storepb.Error{Code: storepb.RPCFail, Err: err,
			Msg: fmt.Sprintf("realclient: no real client at %s (socket %s; start `mooncake client`)", addr, sock)}
	}
	d := &Dummy{addr: addr, conn: c.(*net.UnixConn), timeout: DefaultCallTimeout, poolSize: poolSize}
	for _, o := range opts {
		o(d)
	}
	defer func() {
		if err != nil { // d, not the result, which is nil by now
			d.conn.Close()
			if d.mem != nil {
				_ = unix.Munmap(d.mem)
			}
		}
	}()
	if err := d.hello(ctx, poolSize, stagingSize); err != nil {
		return nil, err
	}
	d.staging = d.mem[poolSize:]
	if poolSize >= PoolAlignment {
		if d.pool, err = alloc.New(poolSize, alloc.WithAlignment(PoolAlignment)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// hello sends the sizes and maps the shared memory whose memfd comes back.
func (d *Dummy) hello(ctx context.Context, poolSize, stagingSize uint64) error {
	defer d.deadline(ctx)()
	q := &Request{Op: OpHello, Arg0: poolSize, Arg1: stagingSize, Replicas: uint32(os.Getpid())}
	f, err := AppendRequest(nil, q)
	if err != nil {
		return err
	}
	if _, err := d.conn.Write(f); err != nil {
		return d.gone(err)
	}
	b := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := d.conn.ReadMsgUnix(b, oob)
	if err != nil {
		return d.gone(err)
	}
	fd, err := fdOf(oob[:oobn])
	if fd >= 0 {
		defer unix.Close(fd) // the mapping keeps the memory
	}
	if err != nil {
		return err
	}
	for n < 4 {
		m, err := d.conn.Read(b[n:])
		if err != nil {
			return d.gone(err)
		}
		n += m
	}
	frame, err := readRest(d.conn, b, b[:n])
	if err != nil {
		return d.gone(err)
	}
	r, err := DecodeResponse(frame)
	if err != nil {
		return err
	}
	if r.Code != 0 {
		return &storepb.Error{Code: storepb.Code(r.Code), Msg: fmt.Sprintf("real client at %s refused the dummy: %s", d.addr, r.Msg)}
	}
	if fd < 0 {
		return fmt.Errorf("%w: hello response without the shared memory's fd", ErrFrame)
	}
	if r.Value < poolSize+stagingSize {
		return fmt.Errorf("%w: %d shared bytes for a pool of %d and staging of %d", ErrFrame, r.Value, poolSize, stagingSize)
	}
	// Pages mapped past the end of the memfd raise SIGBUS when touched.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("realclient: stat the shared memory's fd: %w", err)
	}
	if st.Size < 0 || r.Value > uint64(st.Size) {
		return fmt.Errorf("%w: %d shared bytes run past the end of the memfd (%d bytes)", ErrFrame, r.Value, st.Size)
	}
	d.mem, err = mapShm(fd, r.Value)
	return err
}

// fdOf is the one fd an SCM_RIGHTS message carries (-1 if none); any
// others are closed.
func fdOf(oob []byte) (int, error) {
	fd := -1
	if len(oob) == 0 {
		return fd, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fd, fmt.Errorf("realclient: hello response: %w", err)
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, f := range fds {
			if fd < 0 {
				fd = f
			} else {
				unix.Close(f)
			}
		}
	}
	return fd, nil
}

// deadline makes the connection's I/O end by ctx's deadline (else the
// call timeout) or ctx's cancellation; the returned func undoes it.
func (d *Dummy) deadline(ctx context.Context) func() {
	t, ok := ctx.Deadline()
	if !ok {
		t = time.Now().Add(d.timeout)
	}
	_ = d.conn.SetDeadline(t)
	stop := context.AfterFunc(ctx, func() { _ = d.conn.SetDeadline(time.Now()) })
	return func() { stop() }
}

// gone records that the connection failed and returns the error calls
// get from now on.
func (d *Dummy) gone(err error) error {
	if d.broken == nil {
		if errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) {
			err = fmt.Errorf("it hung up (exited or was killed): %w", err)
		}
		d.broken = &storepb.Error{Code: storepb.RPCFail, Msg: fmt.Sprintf("real client at %s: %v", d.addr, err), Err: ErrGone}
	}
	return d.broken
}

// roundTrip sends q and returns its response; d.mu is held.
func (d *Dummy) roundTrip(ctx context.Context, q *Request) (*Response, error) {
	return d.roundTripFD(ctx, q, -1)
}

// roundTripFD is roundTrip with fd sent along (SCM_RIGHTS) when >= 0.
func (d *Dummy) roundTripFD(ctx context.Context, q *Request, fd int) (*Response, error) {
	if d.closed {
		return nil, &storepb.Error{Code: storepb.InvalidParams, Msg: "dummy client is closed"}
	}
	if d.broken != nil {
		return nil, d.broken
	}
	f, err := AppendRequest(d.buf, q)
	if err != nil {
		return nil, &storepb.Error{Code: storepb.InvalidParams, Err: err}
	}
	defer d.deadline(ctx)()
	if fd >= 0 {
		n, _, err := d.conn.WriteMsgUnix(f, unix.UnixRights(fd), nil)
		if err == nil && n < len(f) {
			_, err = d.conn.Write(f[n:])
		}
		if err != nil {
			return nil, d.gone(err)
		}
	} else if _, err := d.conn.Write(f); err != nil {
		return nil, d.gone(err)
	}
	f, err = ReadFrame(d.conn, f[:0])
	if err != nil {
		return nil, d.gone(err)
	}
	d.buf = f[:0]
	r, err := DecodeResponse(f)
	if err != nil {
		return nil, d.gone(err)
	}
	if r.Code != 0 {
		return nil, &storepb.Error{Code: storepb.Code(r.Code), Msg: "real client: " + r.Msg}
	}
	if r.Op != q.Op || len(r.Results) != len(q.Items) {
		return nil, d.gone(fmt.Errorf("%w: %v with %d results to %v of %d items", ErrFrame, r.Op, len(r.Results), q.Op, len(q.Items)))
	}
	return r, nil
}

// itemErr is the error of a failed Result.
func itemErr(key string, res Result, msg string) error {
	if res.Code == 0 {
		return nil
	}
	return &storepb.Error{Code: storepb.Code(res.Code), Msg: fmt.Sprintf("key %q (real client: %s)", key, msg)}
}

// Alloc returns n bytes of the pool: memory the real client reads and
// writes directly, so puts from it and gets into it copy nothing here.
// It returns an error when the pool has no room (or Dial asked for none).
func (d *Dummy) Alloc(n uint64) ([]byte, error) {
	d.poolMu.Lock()
	defer d.poolMu.Unlock()
	if d.pool == nil {
		return nil, &storepb.Error{Code: storepb.InvalidParams, Msg: "dummy client has no memory pool (mem_pool_size 0)"}
	}
	off, ok := d.pool.Alloc(n)
	if !ok {
		return nil, &storepb.Error{Code: storepb.NoAvailableHandle,
			Msg: fmt.Sprintf("no room for %d bytes in the dummy's pool (%d of %d bytes used)", n, d.pool.Used(), d.pool.Size())}
	}
	return d.mem[off : off+n : off+n], nil
}

// Free returns a buffer Alloc handed out.
func (d *Dummy) Free(b []byte) error {
	d.poolMu.Lock()
	defer d.poolMu.Unlock()
	if d.pool == nil {
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "dummy client has no memory pool, or is closed"}
	}
	off, ok := within(d.mem, b)
	if !ok || off >= d.poolSize {
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "buffer is not from the dummy's pool"}
	}
	if err := d.pool.Free(off); err != nil {
		return &storepb.Error{Code: storepb.InvalidParams, Err: err}
	}
	return nil
}

// Shared is the memory shared with the real client (pool, then staging).
func (d *Dummy) Shared() []byte { return d.mem }

// locate finds b in memory the real client maps too: the region and
// offset to name it by. d.mu is held.
func (d *Dummy) locate(b []byte) (uint32, uint64, bool) {
	if off, ok := within(d.mem, b); ok {
		return 0, off, true
	}
	for _, r := range d.regions {
		if off, ok := within(r.mem, b); ok {
			return r.id, off, true
		}
	}
	return 0, 0, false
}

// RegisterShared makes mem, which is the mapping of len(mem) bytes at
// offset off of the memfd (or other shareable file) fd, known to the real
// client, which maps the same pages: puts from and gets into it then move
// no byte through this process (MooncakeHostMemAllocator's memory
// registered with register_buffer). fd stays the caller's.
func (d *Dummy) RegisterShared(ctx context.Context, fd int, off uint64, mem []byte) error {
	if len(mem) == 0 || fd < 0 {
		return &storepb.Error{Code: storepb.InvalidParams, Msg: "register shared memory: empty buffer or no fd"}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.regions {
		if _, ok := within(r.mem, mem[:1]); ok {
			return &storepb.Error{Code: storepb.InvalidParams, Msg: "register shared memory: overlaps a registered region"}
		}
	}
	r, err := d.roundTripFD(ctx, &Request{Op: OpRegister, Arg0: uint64(len(mem)), Arg1: off}, fd)
	if err != nil {
		return err
	}
	d.regions = append(d.regions, region{id: uint32(r.Value), mem: mem})
	return nil
}

// UnregisterShared undoes RegisterShared of the region starting at mem[0];
// false when no region starts there.
func (d *Dummy) UnregisterShared(ctx context.Context, mem []byte) (bool, error) {
	if len(mem) == 0 {
		return false, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, r := range d.regions {
		if off, ok := within(r.mem, mem[:1]); ok && off == 0 {
			d.regions = append(d.regions[:i], d.regions[i+1:]...)
			_, err := d.roundTrip(ctx, &Request{Op: OpUnregister, Arg0: uint64(r.id)})
			return true, err
		}
	}
	return false, nil
}

// plan is how the items of one batch put or get travel: by offset where
// the caller's buffer is shared memory, else through staging, in rounds
// that each fit the staging buffer.
type plan struct {
	items  []Item
	staged []int   // per item: its round (0, 1, ...) if staged, else -1
	rounds int     // at least 1 when anything is sent
	errs   []error // items that cannot travel at all
}

func (d *Dummy) plan(keys []string, bufs [][]byte) plan {
	p := plan{items: make([]Item, len(keys)), staged: make([]int, len(keys)), errs: make([]error, len(keys))}
	used, round := uint64(0), 0
	anyDirect := false
	for i, b := range bufs {
		p.items[i].Key = keys[i]
		p.items[i].Len = uint64(len(b))
		if id, off, ok := d.locate(b); ok {
			p.items[i].Region, p.items[i].Off, p.staged[i] = id, off, -1
			anyDirect = true
			continue
		}
		n := uint64(len(b))
		if n > uint64(len(d.staging)) {
			p.staged[i] = -1
			p.errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: fmt.Sprintf(
				"key %q: %d bytes outside the dummy's pool need staging, and the staging buffer (local_buffer_size) holds %d; allocate them with alloc_from_mem_pool",
				keys[i], n, len(d.staging))}
			continue
		}
		if used+n > uint64(len(d.staging)) {
			round, used = round+1, 0
		}
		p.items[i].Off, p.staged[i] = d.poolSize+used, round
		used += (n + 63) &^ 63
		p.rounds = round + 1
	}
	if anyDirect && p.rounds == 0 {
		p.rounds = 1
	}
	return p
}

// batch runs a put or get of bufs in rounds: before each round the values
// to stage are copied into staging (put), after it the bytes read are
// copied out (get). res(i, r) records item i's result.
func (d *Dummy) batch(ctx context.Context, q Request, keys []string, bufs [][]byte, res func(i int, r Result, msg string)) []error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		errs := make([]error, len(keys))
		for i := range errs {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: "dummy client is closed"}
		}
		return errs
	}
	p := d.plan(keys, bufs)
	for round := 0; round < p.rounds; round++ {
		var idx []int
		for i := range keys {
			if p.errs[i] == nil && (p.staged[i] == round || (p.staged[i] == -1 && round == 0)) {
				idx = append(idx, i)
			}
		}
		q.Items = q.Items[:0]
		for _, i := range idx {
			if q.Op == OpPut && p.staged[i] >= 0 {
				copy(d.mem[p.items[i].Off:], bufs[i])
			}
			q.Items = append(q.Items, p.items[i])
		}
		if len(q.Items) == 0 {
			continue
		}
		r, err := d.roundTrip(ctx, &q)
		for j, i := range idx {
			if err != nil {
				p.errs[i] = err
				continue
			}
			res(i, r.Results[j], r.Msg)
			p.errs[i] = itemErr(keys[i], r.Results[j], r.Msg)
			if q.Op == OpGet && p.staged[i] >= 0 && p.errs[i] == nil {
				n := min(r.Results[j].N, uint64(len(bufs[i])))
				copy(bufs[i][:n], d.mem[p.items[i].Off:p.items[i].Off+n])
			}
		}
	}
	return p.errs
}

// BatchPut stores values[i] under keys[i] (an upsert overwrites, a put
// does not); nil rc is the real client's default replication.
func (d *Dummy) BatchPut(ctx context.Context, keys []string, values [][]byte, rc *client.ReplicateConfig, upsert bool) []error {
	q := Request{Op: OpPut}
	if upsert {
		q.Flags |= FlagUpsert
	}
	if rc != nil {
		q.Replicas, q.PinTTLms, q.Preferred = uint32(rc.Replicas), uint64(rc.SoftPinTTL.Milliseconds()), rc.PreferredSegments
		for _, f := range []struct {
			on   bool
			flag uint16
		}{{rc.SoftPin, FlagSoftPin}, {rc.HardPin, FlagHardPin}, {rc.PreferLocal, FlagPreferLocal}} {
			if f.on {
				q.Flags |= f.flag
			}
		}
	}
	return d.batch(ctx, q, keys, values, func(int, Result, string) {})
}

// BatchGetInto reads the value of keys[i] into dsts[i] and returns its
// length.
func (d *Dummy) BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, []error) {
	ns := make([]int, len(keys))
	errs := d.batch(ctx, Request{Op: OpGet}, keys, dsts, func(i int, r Result, _ string) { ns[i] = int(r.N) })
	return ns, errs
}

// Get returns the value of key (its size first, then the bytes through
// staging).
func (d *Dummy) Get(ctx context.Context, key string) ([]byte, error) {
	n, err := d.Size(ctx, key)
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	ns, errs := d.BatchGetInto(ctx, []string{key}, [][]byte{b})
	if errs[0] != nil {
		return nil, errs[0]
	}
	return b[:ns[0]], nil
}

// keyed runs a request of items that carry only keys.
func (d *Dummy) keyed(ctx context.Context, q Request, keys []string) ([]Result, []error) {
	for _, k := range keys {
		q.Items = append(q.Items, Item{Key: k})
	}
	errs := make([]error, len(keys))
	d.mu.Lock()
	r, err := d.roundTrip(ctx, &q)
	d.mu.Unlock()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return make([]Result, len(keys)), errs
	}
	for i, res := range r.Results {
		errs[i] = itemErr(keys[i], res, r.Msg)
	}
	return r.Results, errs
}

// BatchExist says whether each key exists.
func (d *Dummy) BatchExist(ctx context.Context, keys []string) ([]bool, []error) {
	rs, errs := d.keyed(ctx, Request{Op: OpExist}, keys)
	ok := make([]bool, len(keys))
	for i, r := range rs {
		ok[i] = errs[i] == nil && r.N == 1
	}
	return ok, errs
}

// Size is the size of key's value.
func (d *Dummy) Size(ctx context.Context, key string) (uint64, error) {
	rs, errs := d.keyed(ctx, Request{Op: OpSize}, []string{key})
	return rs[0].N, errs[0]
}

// BatchRemove removes keys (force: leases notwithstanding).
func (d *Dummy) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	q := Request{Op: OpRemove}
	if force {
		q.Flags = FlagForce
	}
	_, errs := d.keyed(ctx, q, keys)
	return errs
}

// RemoveAll removes every object and returns how many.
func (d *Dummy) RemoveAll(ctx context.Context, force bool) (int, error) {
	q := Request{Op: OpRemoveAll}
	if force {
		q.Flags = FlagForce
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.roundTrip(ctx, &q)
	if err != nil {
		return 0, err
	}
	return int(r.Value), nil
}

// Close hangs up, which makes the real client free the shared memory it
// holds for this dummy, and unmaps it here. Buffers from Alloc must not be
// used after. It is idempotent.
func (d *Dummy) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	err := d.conn.Close()
	d.poolMu.Lock()
	d.pool = nil // Alloc fails from now on
	d.poolMu.Unlock()
	if d.mem != nil {
		_ = unix.Munmap(d.mem)
		d.mem, d.staging = nil, nil
	}
	return err
}

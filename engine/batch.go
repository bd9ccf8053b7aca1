package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// batch is a set of tasks submitted together and awaited together.
type batch struct {
	capacity int

	mu         sync.Mutex
	tasks      []*task
	unfinished int
	waiters    []chan struct{}
	notify     *pendingNotify
	// inline holds slices whose request Submit sent from the caller's
	// goroutine; their answers are left to the caller's Wait (or to the
	// transport's readers once a status poll releases them).
	inline []transport.Inline
}

type pendingNotify struct {
	seg *segment
	n   Notify
}

// task is one submitted Request, cut into slices.
type task struct {
	e      *Engine
	b      *batch
	op     Op
	via    string
	length uint64
	start  time.Time
	left   atomic.Int32
	done   atomic.Uint64
	status atomic.Int32
	err    atomic.Pointer[error]
	// With WithChecksum: local is the request's local address and sum
	// collects, slice by slice, the CRC-32C of its bytes (crc32c.Shift).
	crc   bool
	local uintptr
	sum   atomic.Uint32
	// ldev is the slices' LocalDevice: 1 + the GPU holding the local
	// range, 0 for host memory.
	ldev int
}

// SubmitOption adjusts one Submit call.
type SubmitOption func(*submitOpts)

type submitOpts struct {
	deadline time.Time
	notify   *Notify
	checksum bool
}

// WithDeadline brings the deadline of the submitted requests forward. It
// never extends it: a request runs at most Config.Timeout from its
// submission (MC_TRANSFER_TIMEOUT), the operator's bound on a transfer to
// a peer that does not answer.
func WithDeadline(t time.Time) SubmitOption { return func(o *submitOpts) { o.deadline = t } }

// WithNotify sends n to the target of the first request once every task of
// the batch has completed successfully (Mooncake's submitTransferWithNotify).
func WithNotify(n Notify) SubmitOption { return func(o *submitOpts) { o.notify = &n } }

// WithChecksum has every submitted request's bytes checksummed (CRC-32C)
// once they are in place: each slice as it finishes, on the goroutine that
// moved it, while the rest of the request is still on its way. The
// checksum of a Completed task is TransferStatus.Checksum. A reader that
// verifies what it read so pays for no second pass over the bytes after
// the transfer.
func WithChecksum() SubmitOption { return func(o *submitOpts) { o.checksum = true } }

// AllocateBatch returns a batch that holds up to size tasks.
func (e *Engine) AllocateBatch(size int) (BatchID, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	if size <= 0 {
		return 0, errorf(CodeInvalidArgument, "allocate batch of %d", size)
	}
	e.batchMu.Lock()
	defer e.batchMu.Unlock()
	id := e.nextBatch
	e.nextBatch++
	e.batches[id] = &batch{capacity: size}
	return id, nil
}

// FreeBatch releases a batch. A batch with unfinished tasks is busy
// (CodeBatchBusy) and stays allocated.
func (e *Engine) FreeBatch(id BatchID) error {
	e.batchMu.Lock()
	defer e.batchMu.Unlock()
	b, ok := e.batches[id]
	if !ok {
		return errorf(CodeInvalidArgument, "free batch %d: unknown batch", id)
	}
	b.mu.Lock()
	busy := b.unfinished > 0
	b.mu.Unlock()
	if busy {
		b.release()
		return errorf(CodeBatchBusy, "free batch %d: tasks still running", id)
	}
	delete(e.batches, id)
	return nil
}

func (e *Engine) batch(id BatchID) (*batch, error) {
	e.batchMu.RLock()
	defer e.batchMu.RUnlock()
	b, ok := e.batches[id]
	if !ok {
		return nil, errorf(CodeInvalidArgument, "batch %d: unknown batch", id)
	}
	return b, nil
}

// Submit starts reqs as new tasks of batch id; their task IDs follow those
// already submitted to the batch, in order. Every request is checked first
// (registered local memory, open segment, capacity); if one is bad nothing
// is submitted. Submit returns once the work is queued; it may block while
// a peer's queue is full, never past the deadline nor after ctx ends (the
// slices that could not be queued then fail with ctx's error). ctx bounds
// only the queueing: the transfers go on after Submit returns.
func (e *Engine) Submit(ctx context.Context, id BatchID, reqs []Request, opts ...SubmitOption) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	var o submitOpts
	for _, f := range opts {
		f(&o)
	}
	if limit := time.Now().Add(e.cfg.Timeout); o.deadline.IsZero() || o.deadline.After(limit) {
		o.deadline = limit
	}
	b, err := e.batch(id)
	if err != nil {
		return err
	}
	segs := make([]*segment, len(reqs))
	locals := make([]*region, len(reqs))
	targets := make([]*region, len(reqs)) // on the local segment
	for i, r := range reqs {
		if segs[i], locals[i], targets[i], err = e.check(r); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	if o.notify != nil && (len(reqs) == 0 || segs[0] == nil) {
		return errorf(CodeInvalidArgument, "submit with notify: needs a remote target")
	}
	tasks := make([]*task, len(reqs))
	now := time.Now()
	for i, r := range reqs {
		tasks[i] = &task{e: e, b: b, op: r.Op, length: r.Length, start: now, via: e.via(segs[i]),
			crc: o.checksum, local: r.Local, ldev: locals[i].dev + 1}
		tasks[i].status.Store(int32(Pending))
	}
	b.mu.Lock()
	if len(b.tasks)+len(reqs) > b.capacity {
		b.mu.Unlock()
		return errorf(CodeTooManyRequests, "batch %d holds %d tasks: %d submitted, %d more asked",
			id, b.capacity, len(b.tasks), len(reqs))
	}
	if o.notify != nil {
		b.notify = &pendingNotify{seg: segs[0], n: *o.notify}
	}
	b.tasks = append(b.tasks, tasks...)
	b.unfinished += len(reqs)
	b.mu.Unlock()
	if len(reqs) == 0 {
		b.settle(e)
	}
	var few [4]peerSlices
	groups := few[:0] // the remote requests' slices, by peer, in order
	for i, r := range reqs {
		seg := segs[i]
		if seg == nil {
			copyLocal(tasks[i], r, locals[i], targets[i])
			continue
		}
		peer := seg.peers[0]
		j := slices.IndexFunc(groups, func(g peerSlices) bool { return g.peer == peer })
		if j < 0 {
			j = len(groups)
			groups = append(groups, peerSlices{peer: peer})
		}
		if cut := e.cut(tasks[i], r, o.deadline); groups[j].slices == nil {
			groups[j].slices = cut
		} else {
			groups[j].slices = append(groups[j].slices, cut...)
		}
	}
	switch {
	case len(groups) == 0:
	case len(groups) == 1 && o.notify == nil:
		// The slices of a call that all go to one peer whose path can
		// send inline may be sent right here, their answers read by the
		// Wait that follows, so that a shallow queue moves bytes with no
		// goroutine hand-off (see transport.Inliner). Not with a notify:
		// completion must then be seen without the caller.
		g := groups[0]
		if in, ok := g.peer.(transport.Inliner); ok {
			if t := in.SubmitInline(ctx, g.slices); t != nil {
				b.mu.Lock()
				b.inline = append(b.inline, t)
				b.mu.Unlock()
			}
			return nil
		}
		g.submit(ctx)
	default:
		submitAll(ctx, groups)
	}
	return nil
}

// peerSlices is the slices of a call that go to one peer, in order.
type peerSlices struct {
	peer   transport.Peer
	slices []*transport.Slice
}

func (g peerSlices) submit(ctx context.Context) {
	for _, s := range g.slices {
		g.peer.Submit(ctx, s)
	}
}

// bigGroup is the slices a peer's queue is sure to take without waiting
// (a TCP peer queues 1024): a call's slices for one peer up to this many
// are queued in turn, more in parallel with those of other peers.
const bigGroup = 64

// submitAll queues the slices of a call that go to several peers. A peer
// whose queue is full makes Submit wait for room; the slices of the
// other peers must not wait behind it, or a call over several peers (the
// pieces of a striped value, each hundreds of slices) would keep only one
// peer busy at a time. Small groups are queued first, in turn; the large
// ones each on a goroutine of its own (the caller's for the last), and
// submitAll returns once every slice is queued, as Submit promises.
func submitAll(ctx context.Context, groups []peerSlices) {
	var big []peerSlices
	for _, g := range groups {
		if len(g.slices) > bigGroup {
			big = append(big, g)
			continue
		}
		g.submit(ctx)
	}
	if len(big) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, g := range big[:len(big)-1] {
		wg.Go(func() { g.submit(ctx) })
	}
	big[len(big)-1].submit(ctx)
	wg.Wait()
}

// copyLocal runs a task on the local segment: both ranges are ours and
// registered (loc holds the request's local range, tgt its target). GPU
// memory on either side is copied by the driver; a checksum of device
// bytes is taken from a host copy of them.
func copyLocal(t *task, r Request, loc, tgt *region) {
	dst, src := uintptr(r.Remote), r.Local
	if r.Op == Read {
		dst, src = src, dst
	}
	s := &transport.Slice{Local: r.Local, Length: r.Length, LocalDevice: t.ldev}
	t.left.Store(1)
	if !loc.onDevice() && !tgt.onDevice() {
		copy(transport.Bytes(dst, r.Length), transport.Bytes(src, r.Length))
		t.sliceDone(s, nil)
		return
	}
	drv, dev := loc.drv, loc.dev
	if !loc.onDevice() {
		drv, dev = tgt.drv, tgt.dev
	}
	var err error
	if t.crc && loc.onDevice() {
		tmp := make([]byte, r.Length)
		err = drv.Copy(dev, engineAddr(tmp), src, r.Length)
		if err == nil {
			s.CRC, s.Summed = crc32c.Checksum(tmp), true
			err = drv.Copy(dev, dst, engineAddr(tmp), r.Length)
		}
	} else {
		err = drv.Copy(dev, dst, src, r.Length)
	}
	if err != nil {
		err = wrapf(CodeMemory, err, "copy %#x+%d on the local segment", r.Remote, r.Length)
	}
	t.sliceDone(s, err)
}

// engineAddr is the address of b's first byte, for a driver call that
// keeps no reference to it past its return.
func engineAddr(b []byte) uintptr { return AddrOf(b) }

// check validates a request and returns its segment (nil for local), the
// region holding its local range and, on the local segment, the region
// holding its target.
func (e *Engine) check(r Request) (seg *segment, loc, tgt *region, err error) {
	if r.Op != Read && r.Op != Write {
		return nil, nil, nil, errorf(CodeInvalidArgument, "opcode %d", r.Op)
	}
	if r.Length == 0 {
		return nil, nil, nil, errorf(CodeInvalidArgument, "zero-length transfer")
	}
	if loc = e.mem.find(uint64(r.Local), r.Length); loc == nil {
		return nil, nil, nil, errorf(CodeAddressNotRegistered, "local %#x+%d is not inside registered memory", r.Local, r.Length)
	}
	if r.Segment == LocalSegment {
		if tgt = e.mem.find(r.Remote, r.Length); tgt == nil {
			return nil, nil, nil, errorf(CodeAddressNotRegistered, "local segment %#x+%d is not inside registered memory", r.Remote, r.Length)
		}
		return nil, loc, tgt, nil
	}
	if seg = e.segment(r.Segment); seg == nil {
		return nil, nil, nil, errorf(CodeInvalidArgument, "segment %d is not open", r.Segment)
	}
	return seg, loc, nil, nil
}

// via names the path a task to seg takes, for metrics.
func (e *Engine) via(seg *segment) string {
	if seg == nil {
		return "local"
	}
	return seg.peers[0].Path()
}

// cut cuts a task into slices (of SliceSize, DeviceSliceSize from GPU
// memory; the tail absorbs a remainder under a quarter slice, as Mooncake
// does).
func (e *Engine) cut(t *task, r Request, deadline time.Time) []*transport.Slice {
	size := e.cfg.SliceSize
	if t.ldev > 0 {
		size = e.cfg.DeviceSliceSize
	}
	n := r.Length / size
	if n == 0 || r.Length%size > size/4 {
		n++
	}
	t.left.Store(int32(n))
	sl := make([]*transport.Slice, n)
	off := uint64(0)
	for i := range sl {
		l := size
		if i == len(sl)-1 {
			l = r.Length - off
		}
		sl[i] = &transport.Slice{Op: r.Op, Local: r.Local + uintptr(off), Remote: r.Remote + off,
			Length: l, Deadline: deadline, Done: t.sliceDone,
			LocalDevice: t.ldev, Checksum: t.crc && (t.ldev > 0 || r.Op == Write)}
		off += l
	}
	return sl
}

func (t *task) sliceDone(s *transport.Slice, err error) {
	switch {
	case err != nil:
		t.setErr(err)
	case t.crc && s.LocalDevice > 0 && !s.Summed:
		// Device bytes are the driver's to read, not the CPU's: a path
		// that moved them had a host copy and should have summed it.
		t.setErr(errorf(CodeNotImplemented, "checksum of %d bytes of GPU memory: the path did not take it", s.Length))
	default:
		t.done.Add(s.Length)
		if t.crc {
			t.addChecksum(s)
		}
	}
	if t.left.Add(-1) != 0 {
		return
	}
	st := Completed
	if p := t.err.Load(); p != nil {
		st = Failed
		// A Submit whose ctx ran out before a slice was queued timed out
		// as surely as a slice past its own deadline.
		if errors.Is(*p, transport.ErrTimeout) || errors.Is(*p, context.DeadlineExceeded) {
			st = Timeout
		}
	}
	t.e.m.finished(t.op, t.via, t.length, st, time.Since(t.start))
	t.b.taskDone(t, st)
}

// setErr records the error the task fails with: the first one, unless a
// later slice was refused by the peer, which says more (a peer that hangs
// up on a refusal, as Mooncake's does, fails the slices queued behind it
// on the connection with mere connection errors).
func (t *task) setErr(err error) {
	rejected := errors.Is(err, transport.ErrRejected)
	for {
		p := t.err.Load()
		if p != nil && (!rejected || errors.Is(*p, transport.ErrRejected)) {
			return
		}
		if t.err.CompareAndSwap(p, &err) {
			return
		}
	}
}

// addChecksum folds the checksum of s, whose bytes are in place, into the
// task's: slices finish in any order, and each contributes its own term.
func (t *task) addChecksum(s *transport.Slice) {
	after := t.length - (uint64(s.Local-t.local) + s.Length)
	sum := s.CRC
	if !s.Summed {
		sum = crc32c.Checksum(transport.Bytes(s.Local, s.Length))
	}
	term := crc32c.Shift(sum, after)
	for {
		old := t.sum.Load()
		if t.sum.CompareAndSwap(old, old^term) {
			return
		}
	}
}

// taskDone publishes t's final status st and counts it finished, under one
// lock: whoever has seen every task final can free the batch.
func (b *batch) taskDone(t *task, st Status) {
	b.mu.Lock()
	t.status.Store(int32(st))
	b.unfinished--
	b.mu.Unlock()
	b.settle(t.e)
}

// settle wakes waiters and sends the pending notify once nothing is left.
func (b *batch) settle(e *Engine) {
	b.mu.Lock()
	if b.unfinished > 0 {
		b.mu.Unlock()
		return
	}
	ws := b.waiters
	b.waiters = nil
	pn := b.notify
	b.notify = nil
	ok := true
	for _, t := range b.tasks {
		ok = ok && Status(t.status.Load()) == Completed
	}
	b.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
	if pn == nil {
		return
	}
	if !ok {
		e.log.Warn("batch failed: notification not sent", "segment", pn.seg.name, "notify", pn.n.Name)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.Timeout)
		defer cancel()
		if err := e.SendNotify(ctx, pn.seg.name, pn.n); err != nil {
			e.log.Warn("batch notification failed", "segment", pn.seg.name, "err", err)
		}
	}()
}

// takeInline returns the batch's inline slices, which become the caller's
// to wait for or release.
func (b *batch) takeInline() []transport.Inline {
	b.mu.Lock()
	defer b.mu.Unlock()
	ins := b.inline
	b.inline = nil
	return ins
}

// release leaves the batch's inline slices to the transport's readers: the
// caller polls rather than waits, and their answers must not wait for it.
func (b *batch) release() {
	for _, in := range b.takeInline() {
		in.Release()
	}
}

// TaskStatus returns the state of task (its index in submission order).
func (e *Engine) TaskStatus(id BatchID, taskID int) (TransferStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return TransferStatus{}, err
	}
	b.release()
	b.mu.Lock()
	if taskID < 0 || taskID >= len(b.tasks) {
		n := len(b.tasks)
		b.mu.Unlock()
		return TransferStatus{}, errorf(CodeInvalidArgument, "batch %d has no task %d (%d submitted)", id, taskID, n)
	}
	t := b.tasks[taskID]
	b.mu.Unlock()
	return t.state(), nil
}

func (t *task) state() TransferStatus {
	ts := TransferStatus{Status: Status(t.status.Load()), Transferred: t.done.Load()}
	if ts.Status.Done() {
		if p := t.err.Load(); p != nil {
			ts.Err = *p
		}
	}
	if ts.Status == Completed && t.crc {
		ts.Checksum = t.sum.Load()
	}
	return ts
}

// BatchStatus sums up a batch: Waiting when empty, Pending while any task
// runs, then Completed if every task completed, else the first failure.
func (e *Engine) BatchStatus(id BatchID) (TransferStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return TransferStatus{}, err
	}
	b.release()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.summary(), nil
}

func (b *batch) summary() TransferStatus {
	if len(b.tasks) == 0 {
		return TransferStatus{Status: Waiting}
	}
	sum := TransferStatus{Status: Completed}
	for _, t := range b.tasks {
		s := t.state()
		sum.Transferred += s.Transferred
		switch {
		case !s.Status.Done():
			sum.Status = Pending
		case s.Status != Completed && sum.Status == Completed:
			sum.Status, sum.Err = s.Status, s.Err
		}
	}
	if b.unfinished > 0 {
		sum.Status, sum.Err = Pending, nil
	}
	return sum
}

// Wait blocks until every task of the batch is final or ctx ends, and
// returns the batch summary. Answers that Submit left to its caller are read
// here, in the calling goroutine.
func (e *Engine) Wait(ctx context.Context, id BatchID) (TransferStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return TransferStatus{}, err
	}
	ins := b.takeInline()
	for i, in := range ins {
		if ctx.Err() != nil {
			for _, in := range ins[i:] {
				in.Release()
			}
			break
		}
		in.Wait(ctx)
	}
	b.mu.Lock()
	if b.unfinished == 0 {
		defer b.mu.Unlock()
		return b.summary(), nil
	}
	w := make(chan struct{})
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w:
	case <-ctx.Done():
		return TransferStatus{Status: Pending}, ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.summary(), nil
}

package realclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Store is what the real client serves dummy clients with: its store
// client, the one with the segment (*client.Client).
type Store interface {
	RegisterBuffer(b []byte) error
	UnregisterBuffer(b []byte) error
	BatchPutFrom(ctx context.Context, keys []string, values [][]byte, rc *client.ReplicateConfig) []error
	BatchUpsert(ctx context.Context, keys []string, values [][]byte, rc *client.ReplicateConfig) []error
	BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, []error)
	BatchExist(ctx context.Context, keys []string) ([]bool, []error)
	Size(ctx context.Context, key string) (uint64, error)
	BatchRemove(ctx context.Context, keys []string, force bool) []error
	RemoveAll(ctx context.Context, force bool) (int, error)
}

var _ Store = (*client.Client)(nil)

// Defaults of Config.
const (
	DefaultMaxShared   = 1 << 40
	DefaultMaxSessions = 1024
)

// Config configures a Server.
type Config struct {
	// Store serves the calls; required.
	Store Store
	// Socket is the unix socket to listen on, as SocketFor names it.
	// Zero: that of DefaultPort, "@mooncake_client.50052".
	Socket string
	// MaxShared bounds the shared memory (pool plus staging) one dummy
	// client may ask for. Zero: 1 TiB (pages are only allocated as they
	// are touched).
	MaxShared uint64
	// MaxSessions bounds the dummy clients connected at once. Zero: 1024.
	MaxSessions int
	// AnyUser accepts dummy clients run by any user. Zero accepts only
	// this process's user and root: the socket is abstract, so every
	// process in the network namespace can reach it, and a dummy may
	// read, overwrite and remove every object of the tenant.
	AnyUser bool
	// Logger receives session starts and ends. Zero: slog.Default().
	Logger *slog.Logger
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("realclient: Config.Store is nil")
	case c.MaxSessions < 0:
		return fmt.Errorf("realclient: Config.MaxSessions %d is negative", c.MaxSessions)
	}
	return nil
}

// Server is the real client's side: it accepts dummy clients on a unix
// socket, gives each its shared memory, and runs their calls on Store.
type Server struct {
	cfg Config
	ln  *net.UnixListener

	ctx    context.Context // canceled by Close: calls in progress end
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced whenever sessions changes
	sessions map[*session]struct{}
	closed   bool

	requestBytes atomic.Uint64
}

// Listen starts a Server on cfg.Socket.
func Listen(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Socket == "" {
		cfg.Socket = fmt.Sprintf("@mooncake_client.%d", DefaultPort)
	}
	if cfg.MaxShared == 0 {
		cfg.MaxShared = DefaultMaxShared
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	removeStale(cfg.Socket)
	ln, err := net.ListenUnix("unix", unixAddr(cfg.Socket))
	if err != nil {
		return nil, fmt.Errorf("realclient: listen for dummy clients on %s: %w", cfg.Socket, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, ln: ln, ctx: ctx, cancel: cancel, changed: make(chan struct{}), sessions: map[*session]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the socket the server listens on.
func (s *Server) Addr() string { return s.cfg.Socket }

// Sessions is the number of dummy clients connected now.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// WaitSessions waits until exactly n dummy clients are connected.
func (s *Server) WaitSessions(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got, ch := len(s.sessions), s.changed
		s.mu.Unlock()
		if got == n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("realclient: %d sessions, waiting for %d: %w", got, n, ctx.Err())
		}
	}
}

// RequestBytes is the number of request bytes received from dummy
// clients so far: keys and offsets, never values.
func (s *Server) RequestBytes() uint64 { return s.requestBytes.Load() }

// Close stops accepting, ends every session (their calls in progress
// first) and frees their shared memory. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for se := range s.sessions {
		// Its loop ends after the call in progress; a write deadline too,
		// so that an answer to a dummy that does not read cannot hold it.
		_ = se.conn.SetDeadline(time.Now())
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.cancel()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Error("realclient: accept", "err", err)
			}
			return
		}
		if err := s.allowed(c); err != nil {
			s.cfg.Logger.Warn("realclient: refused a dummy client", "err", err)
			_ = c.Close()
			continue
		}
		se := &session{srv: s, conn: c, shm: &shm{fd: -1}, oob: make([]byte, unix.CmsgSpace(4*4)), regions: map[uint32][]byte{}}
		if !s.add(se) {
			_ = c.Close()
			continue
		}
		s.wg.Add(1)
		go se.serve()
	}
}

// allowed checks the user of the process at the other end of c (the
// kernel's SO_PEERCRED, fixed at connect): this process's own or root,
// unless Config.AnyUser.
func (s *Server) allowed(c *net.UnixConn) error {
	if s.cfg.AnyUser {
		return nil
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("peer credentials: %w", credErr)
	}
	if own := uint32(os.Geteuid()); cred.Uid != own && cred.Uid != 0 {
		return fmt.Errorf("pid %d runs as uid %d, not this real client's %d (mooncake client --dummy_any_user accepts every user)", cred.Pid, cred.Uid, own)
	}
	return nil
}

// add registers se, unless the server is closed or full.
func (s *Server) add(se *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if len(s.sessions) >= s.cfg.MaxSessions {
		s.cfg.Logger.Warn("realclient: refused a dummy client", "sessions", len(s.sessions))
		return false
	}
	s.sessions[se] = struct{}{}
	s.notify()
	return true
}

func (s *Server) remove(se *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, se)
	s.notify()
}

// notify wakes WaitSessions; s.mu is held.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// session is one dummy client: its connection and shared memory.
type session struct {
	srv        *Server
	conn       *net.UnixConn
	shm        *shm
	registered bool
	pid        uint64
	in, out    []byte
	oob        []byte
	fds        []int             // received with the request being served
	regions    map[uint32][]byte // memory the dummy registered (OpRegister), mapped here
	nextRegion uint32
}

// MaxRegions bounds the memory regions one dummy may register.
const MaxRegions = 4096

// serve runs the session until the dummy hangs up, sends a malformed
// frame, or the server closes; then it frees what it held for the dummy.
func (se *session) serve() {
	s := se.srv
	defer s.wg.Done()
	defer s.remove(se)
	defer se.free()
	err := se.hello()
	for err == nil {
		err = se.call()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
		s.cfg.Logger.Info("realclient: dummy client left", "pid", se.pid, "shared_bytes", len(se.shm.mem))
		return
	}
	s.cfg.Logger.Warn("realclient: dummy client dropped", "pid", se.pid, "err", err)
}

// free unregisters and unmaps the dummy's shared memory: its pages go
// once the dummy's mapping is gone too.
func (se *session) free() {
	se.closeFDs()
	for id := range se.regions {
		se.unregister(id)
	}
	if se.registered {
		if err := se.srv.cfg.Store.UnregisterBuffer(se.shm.mem); err != nil {
			se.srv.cfg.Logger.Warn("realclient: unregister a dummy's memory", "err", err)
		}
	}
	se.shm.close()
	_ = se.conn.Close()
}

func (se *session) read() (*Request, error) {
	se.closeFDs()
	f, err := se.readFrame()
	if err != nil {
		return nil, err
	}
	se.in = f[:0]
	se.srv.requestBytes.Add(uint64(len(f)))
	q, err := DecodeRequest(f)
	if err != nil {
		// The stream cannot be trusted past a bad frame: say why, hang up.
		se.reply(&Response{Op: OpHello, Code: int32(storepb.InvalidParams), Msg: err.Error()}, -1)
		return nil, err
	}
	return q, nil
}

// readFrame reads one frame and the fds that came with its first bytes:
// its length is read with recvmsg, which is where a sender's SCM_RIGHTS
// arrive (they ride on the first byte of the sendmsg that carries them).
func (se *session) readFrame() ([]byte, error) {
	var l [4]byte
	n, oobn, _, _, err := se.conn.ReadMsgUnix(l[:], se.oob)
	if oobn > 0 {
		fd, perr := fdOf(se.oob[:oobn])
		if fd >= 0 {
			se.fds = append(se.fds, fd)
		}
		if perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	if _, err := io.ReadFull(se.conn, l[n:]); err != nil {
		return nil, err
	}
	f, err := readRest(se.conn, se.in, l[:])
	if err != nil {
		return nil, err
	}
	se.in = f[:0]
	return f, nil
}

// closeFDs closes the fds of the last request that it did not keep.
func (se *session) closeFDs() {
	for _, fd := range se.fds {
		_ = unix.Close(fd)
	}
	se.fds = se.fds[:0]
}

// reply sends r, with fd as SCM_RIGHTS when fd >= 0.
func (se *session) reply(r *Response, fd int) error {
	f, err := AppendResponse(se.out, r)
	if err != nil {
		return err
	}
	se.out = f[:0]
	if fd < 0 {
		_, err = se.conn.Write(f)
		return err
	}
	n, _, err := se.conn.WriteMsgUnix(f, unix.UnixRights(fd), nil)
	if err == nil && n < len(f) {
		_, err = se.conn.Write(f[n:])
	}
	return err
}

// hello sets the session up: the first request must be OpHello with the
// sizes of the dummy's pool and staging buffer.
func (se *session) hello() error {
	q, err := se.read()
	if err != nil {
		return err
	}
	fail := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		_ = se.reply(&Response{Op: OpHello, Code: int32(storepb.InvalidParams), Msg: msg}, -1)
		return errors.New("realclient: " + msg)
	}
	if q.Op != OpHello {
		return fail("first request is %v, not hello", q.Op)
	}
	pool, staging := q.Arg0, q.Arg1
	size := pool + staging
	if size < pool || size == 0 || size > se.srv.cfg.MaxShared {
		return fail("pool %d + staging %d bytes: must be positive and at most %d", pool, staging, se.srv.cfg.MaxShared)
	}
	size = (size + pageSize - 1) &^ (pageSize - 1)
	se.pid = uint64(q.Replicas) // a hello's Replicas is the dummy's pid, for logs
	m, err := newShm(size)
	if err != nil {
		return fail("%v", err)
	}
	se.shm = m
	if err := se.srv.cfg.Store.RegisterBuffer(m.mem); err != nil {
		return fail("register the shared memory: %v", err)
	}
	se.registered = true
	se.srv.cfg.Logger.Info("realclient: dummy client joined", "pid", se.pid, "pool", pool, "staging", staging)
	return se.reply(&Response{Op: OpHello, Value: size}, m.fd)
}

const pageSize = 4096

// call runs one request and answers it.
func (se *session) call() error {
	q, err := se.read()
	if err != nil {
		return err
	}
	ctx := se.srv.ctx
	r := &Response{Op: q.Op}
	switch q.Op {
	case OpHello:
		r.Code, r.Msg = int32(storepb.InvalidParams), "hello twice"
	case OpPut, OpGet:
		se.move(ctx, q, r)
	case OpExist:
		keys := keysOf(q.Items)
		ok, errs := se.srv.cfg.Store.BatchExist(ctx, keys)
		r.Results = results(r, errs, func(i int) uint64 { return b2u(ok[i]) })
	case OpSize:
		errs := make([]error, len(q.Items))
		ns := make([]uint64, len(q.Items))
		for i, it := range q.Items {
			ns[i], errs[i] = se.srv.cfg.Store.Size(ctx, it.Key)
		}
		r.Results = results(r, errs, func(i int) uint64 { return ns[i] })
	case OpRemove:
		errs := se.srv.cfg.Store.BatchRemove(ctx, keysOf(q.Items), q.Flags&FlagForce != 0)
		r.Results = results(r, errs, func(int) uint64 { return 0 })
	case OpRemoveAll:
		n, err := se.srv.cfg.Store.RemoveAll(ctx, q.Flags&FlagForce != 0)
		r.Value = uint64(n)
		if err != nil {
			r.Code, r.Msg = codeOf(err), err.Error()
		}
	case OpRegister:
		r.Value, err = se.register(q.Arg0, q.Arg1)
		if err != nil {
			r.Code, r.Msg = int32(storepb.InvalidParams), err.Error()
		}
	case OpUnregister:
		if _, ok := se.regions[uint32(q.Arg0)]; !ok {
			r.Code, r.Msg = int32(storepb.InvalidParams), fmt.Sprintf("region %d is not registered", q.Arg0)
			break
		}
		se.unregister(uint32(q.Arg0))
	}
	return se.reply(r, -1)
}

// register maps size bytes at offset off of the fd that came with the
// request, and registers them with the store: the dummy's own shared
// memory (MooncakeHostMemAllocator's), which puts and gets then name by
// the region returned.
func (se *session) register(size, off uint64) (uint64, error) {
	if len(se.fds) != 1 {
		return 0, fmt.Errorf("register: %d fds came with the request, want 1", len(se.fds))
	}
	if size == 0 || size > se.srv.cfg.MaxShared || off%pageSize != 0 || off > math.MaxInt64 {
		return 0, fmt.Errorf("register: %d bytes at offset %d (want 1 to %d bytes at a page-aligned offset)", size, off, se.srv.cfg.MaxShared)
	}
	if len(se.regions) >= MaxRegions {
		return 0, fmt.Errorf("register: %d regions already, the most a dummy may hold", len(se.regions))
	}
	// Pages past the end of the file map, but touching them raises
	// SIGBUS, which would kill the real client and every dummy's calls.
	// A memfd that allows sealing is sealed against shrinking first, so
	// that the size checked below stays; others (sealing not allowed, or
	// not a memfd) rely on the dummy not shrinking them.
	_, _ = unix.FcntlInt(uintptr(se.fds[0]), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	var st unix.Stat_t
	if err := unix.Fstat(se.fds[0], &st); err != nil {
		return 0, fmt.Errorf("register: stat the dummy's fd: %w", err)
	}
	if st.Size < 0 || off > uint64(st.Size) || size > uint64(st.Size)-off {
		return 0, fmt.Errorf("register: %d bytes at offset %d run past the end of the dummy's file (%d bytes)", size, off, st.Size)
	}
	m, err := unix.Mmap(se.fds[0], int64(off), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("register: map %d bytes of the dummy's memory: %w", size, err)
	}
	if err := se.srv.cfg.Store.RegisterBuffer(m); err != nil {
		_ = unix.Munmap(m)
		return 0, fmt.Errorf("register: %w", err)
	}
	se.nextRegion++
	se.regions[se.nextRegion] = m
	return uint64(se.nextRegion), nil
}

func (se *session) unregister(id uint32) {
	m := se.regions[id]
	delete(se.regions, id)
	if err := se.srv.cfg.Store.UnregisterBuffer(m); err != nil {
		se.srv.cfg.Logger.Warn("realclient: unregister a dummy's region", "err", err)
	}
	_ = unix.Munmap(m)
}

// memOf is the memory a request's region names.
func (se *session) memOf(region uint32) ([]byte, bool) {
	if region == 0 {
		return se.shm.mem, true
	}
	m, ok := se.regions[region]
	return m, ok
}

// move runs a put or a get: each item names bytes of the shared memory,
// which the store reads from (put) or writes into (get) directly.
func (se *session) move(ctx context.Context, q *Request, r *Response) {
	n := len(q.Items)
	errs := make([]error, n)
	keys := make([]string, 0, n)
	bufs := make([][]byte, 0, n)
	idx := make([]int, 0, n) // item of each key sent
	for i, it := range q.Items {
		m, ok := se.memOf(it.Region)
		if !ok {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: fmt.Sprintf("key %q: region %d is not registered", it.Key, it.Region)}
			continue
		}
		b, err := span(m, it.Off, it.Len)
		if err != nil {
			errs[i] = &storepb.Error{Code: storepb.InvalidParams, Msg: fmt.Sprintf("key %q: %v", it.Key, err)}
			continue
		}
		keys, bufs, idx = append(keys, it.Key), append(bufs, b), append(idx, i)
	}
	got := make([]uint64, n)
	if len(keys) > 0 {
		var errs2 []error
		switch {
		case q.Op == OpGet:
			var ns []int
			ns, errs2 = se.srv.cfg.Store.BatchGetInto(ctx, keys, bufs)
			for j, i := range idx {
				got[i] = uint64(ns[j])
			}
		case q.Flags&FlagUpsert != 0:
			errs2 = se.srv.cfg.Store.BatchUpsert(ctx, keys, bufs, replicateOf(q))
		default:
			errs2 = se.srv.cfg.Store.BatchPutFrom(ctx, keys, bufs, replicateOf(q))
		}
		for j, i := range idx {
			errs[i] = errs2[j]
		}
	}
	r.Results = results(r, errs, func(i int) uint64 { return got[i] })
}

// replicateOf is the ReplicateConfig a put request carries; nil (the real
// client's default) when it carries none.
func replicateOf(q *Request) *client.ReplicateConfig {
	const pins = FlagSoftPin | FlagHardPin | FlagPreferLocal
	if q.Replicas == 0 && q.Flags&pins == 0 && q.PinTTLms == 0 && len(q.Preferred) == 0 {
		return nil
	}
	return &client.ReplicateConfig{
		Replicas: int(q.Replicas), SoftPin: q.Flags&FlagSoftPin != 0, HardPin: q.Flags&FlagHardPin != 0,
		SoftPinTTL: time.Duration(q.PinTTLms) * time.Millisecond, PreferLocal: q.Flags&FlagPreferLocal != 0,
		PreferredSegments: q.Preferred,
	}
}

// results turns per-item errors into Results, with n(i) for the items
// that succeeded; the first failure's message goes to r.Msg.
func results(r *Response, errs []error, n func(i int) uint64) []Result {
	out := make([]Result, len(errs))
	for i, err := range errs {
		if err != nil {
			out[i].Code = codeOf(err)
			if r.Msg == "" {
				r.Msg = err.Error()
			}
			continue
		}
		out[i].N = n(i)
	}
	return out
}

// codeOf is the Mooncake error code of err.
func codeOf(err error) int32 {
	var e *storepb.Error
	switch {
	case errors.As(err, &e):
		return int32(e.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return int32(storepb.RPCTimeout)
	}
	return int32(storepb.Internal)
}

func keysOf(items []Item) []string {
	ks := make([]string, len(items))
	for i, it := range items {
		ks[i] = it.Key
	}
	return ks
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

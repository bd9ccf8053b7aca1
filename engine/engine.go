package engine

import (
	"context"
	"encoding/json"

	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/shm"
	"github.com/mooncake-go/mooncake/engine/transport/tcp"
)

// Engine moves bytes between registered memory of this process and the
// segments of peers. All methods are safe for concurrent use.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	secret []byte
	name   string
	meta   metadata.Store // nil in P2PHANDSHAKE mode
	mem    *registry
	m      *metrics

	hs     *metadata.HandshakeServer
	server *tcp.Server
	tcp    *tcp.Client
	shm    *shm.Pool
	ctrl   *shm.Control
	hostID string
	start  uint64

	segMu    sync.Mutex
	segs     map[SegmentID]*segment
	segNames map[string]SegmentID
	nextSeg  SegmentID

	batchMu   sync.RWMutex
	batches   map[BatchID]*batch
	nextBatch BatchID

	notifyMu sync.Mutex
	notifies []Notify

	closing atomic.Bool
	closeMu sync.RWMutex // held for reading by calls in progress
	closed  bool
	wg      sync.WaitGroup // notify senders, TCP fall-backs, view refreshes
	// ctx ends when Close starts: view refreshes in progress give up.
	ctx    context.Context
	cancel context.CancelFunc
}

// segment is an opened peer.
type segment struct {
	id      SegmentID
	name    string
	desc    atomic.Pointer[metadata.SegmentDesc] // as opened or last refreshed
	rpcAddr string
	tcp     []string                      // data addresses
	tcpPeer *tcp.Peer                     // their lanes, nil without a TCP address
	shm     *shm.Peer                     // same-host path, nil if none
	stale   atomic.Bool                   // shm path unavailable; TCP from now on
	refresh viewRefresh                   // of the shm view, after misses
	miss    func(*transport.Slice, error) // e.missed for this segment
}

// maxNotifies bounds undelivered notifications kept for GetNotifies.
const maxNotifies = 1 << 16

// New starts an engine: its handshake and data listeners, and, outside
// P2PHANDSHAKE mode, its records in the metadata store.
func New(cfg Config) (e *Engine, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e = &Engine{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "engine"),
		secret:    []byte(cfg.Secret),
		mem:       newRegistry(),
		m:         newMetrics(cfg.Registerer),
		segs:      map[SegmentID]*segment{},
		segNames:  map[string]SegmentID{},
		nextSeg:   1,
		batches:   map[BatchID]*batch{},
		nextBatch: 1,
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	// Undo whatever was started if a later step fails (through a copy:
	// the failing return has already set e to nil).
	started := e
	defer func() {
		if err != nil {
			started.shutdown()
			e = nil
		}
	}()
	if e.meta, err = metadata.Open(cfg.Metadata); err != nil {
		return nil, &Error{Code: CodeMetadata, Err: err}
	}
	if e.server, err = tcp.Listen(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.DataPort)), tcp.ServerConfig{
		Memory: e.mem, Secret: e.secret, Logger: e.log, Served: e.m.served,
	}); err != nil {
		return nil, &Error{Code: CodeSocket, Err: err}
	}
	if e.hs, err = metadata.ServeHandshake(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.RPCPort)), e.handshake, e.secret, e.log); err != nil {
		return nil, &Error{Code: CodeSocket, Err: err}
	}
	e.tcp = tcp.NewClient(tcp.ClientConfig{
		Lanes: cfg.Lanes, MaxRetries: cfg.MaxRetries, Secret: e.secret, V1: cfg.TCPv1, Logger: e.log,
	})
	if cfg.Transport != "tcp" {
		e.hostID = shm.HostID()
		if e.ctrl, err = shm.NewControl(); err != nil {
			return nil, wrapf(CodeMemory, err, "shared-memory control page")
		}
		if e.start, err = shm.StartTime(os.Getpid()); err != nil {
			return nil, wrapf(CodeMemory, err, "own start time")
		}
		e.shm = shm.NewPool(0)
	}
	e.name = cfg.LocalServerName
	if cfg.Metadata == metadata.P2PHandshake || e.name == "" {
		host := cfg.Host
		if h, _, err := net.SplitHostPort(cfg.LocalServerName); err == nil && h != "" {
			host = h
		} else if cfg.LocalServerName != "" && cfg.Metadata == metadata.P2PHandshake {
			host = cfg.LocalServerName
		}
		e.name = net.JoinHostPort(host, strconv.Itoa(e.hs.Addr().Port))
	}
	if e.meta != nil {
		rpc, _ := json.Marshal(metadata.RPCMeta{IPOrHostName: cfg.Host, RPCPort: e.hs.Addr().Port})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err = e.meta.Put(ctx, metadata.RPCMetaKey(e.name), rpc); err != nil {
			return nil, wrapf(CodeMetadata, err, "publish rpc_meta")
		}
		if err = e.publish(ctx); err != nil {
			return nil, err
		}
	}
	e.log.Info("transfer engine started", "segment", e.name, "rpc", e.hs.Addr().String(),
		"data", e.server.Addr().String(), "metadata", cfg.Metadata, "transport", cfg.Transport)
	return e, nil
}

// Name is this engine's segment name, the one peers open.
func (e *Engine) Name() string { return e.name }

// RPCPort is the handshake port.
func (e *Engine) RPCPort() int { return e.hs.Addr().Port }

// DataPort is the TCP data port.
func (e *Engine) DataPort() int { return e.server.Addr().Port }

// Host is the address this engine is reached at.
func (e *Engine) Host() string { return e.cfg.Host }

// enter guards a call against a concurrent Close.
func (e *Engine) enter() error {
	e.closeMu.RLock()
	if e.closed {
		e.closeMu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (e *Engine) leave() { e.closeMu.RUnlock() }

// Close stops the engine: it removes its metadata records, fails transfers
// still in flight, closes its sockets and waits for every goroutine it
// started. Close is idempotent.
func (e *Engine) Close() error {
	if !e.closing.CompareAndSwap(false, true) {
		return nil
	}
	e.cancel()
	// Fail in-flight work first: a Submit blocked on a full peer queue
	// returns at once instead of holding Close up until its deadline.
	e.tcp.Close()
	if e.shm != nil {
		e.shm.Close()
	}
	e.closeMu.Lock()
	e.closed = true
	e.closeMu.Unlock()
	if e.meta != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.meta.Delete(ctx, metadata.SegmentKey(e.name))
		e.meta.Delete(ctx, metadata.RPCMetaKey(e.name))
		cancel()
	}
	e.shutdown()
	return nil
}

// shutdown releases everything in reverse order of New.
func (e *Engine) shutdown() {
	e.cancel()
	if e.tcp != nil {
		e.tcp.Close()
	}
	if e.shm != nil {
		e.shm.Close()
	}
	e.wg.Wait()
	e.segMu.Lock()
	for _, s := range e.segs {
		if s.shm != nil {
			s.shm.Close()
		}
	}
	e.segs = map[SegmentID]*segment{}
	e.segMu.Unlock()
	if e.hs != nil {
		e.hs.Close()
	}
	if e.server != nil {
		e.server.Close()
	}
	if e.ctrl != nil {
		e.ctrl.Close()
	}
	if e.meta != nil {
		e.meta.Close()
	}
}

// RegisterMemory makes [addr, addr+length) usable in transfers; when
// remoteAccessible, peers may read and write it. Zero-length and
// overlapping regions are rejected (CodeAddressOverlapped), as Mooncake.
func (e *Engine) RegisterMemory(addr uintptr, length uint64, location string, remoteAccessible bool) error {
	return e.register(uint64(addr), length, location, remoteAccessible, -1)
}

func (e *Engine) register(addr, length uint64, location string, remote bool, fd int) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if location == "" || location == "*" {
		location = "cpu:0"
	}
	if err := e.mem.add(&region{addr: addr, length: length, location: location, remote: remote, fd: fd}); err != nil {
		return err
	}
	return e.republish()
}

// UnregisterMemory removes the region registered at addr. It returns once
// no transfer serving a peer touches the region any more.
func (e *Engine) UnregisterMemory(addr uintptr) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if _, err := e.mem.remove(uint64(addr)); err != nil {
		return err
	}
	if e.ctrl != nil {
		e.ctrl.Bump()
	}
	return e.republish()
}

func (e *Engine) republish() error {
	if e.meta == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.publish(ctx)
}

// descriptor is this engine's segment descriptor as peers see it.
func (e *Engine) descriptor() *metadata.SegmentDesc {
	// The control counter is read before the regions are listed, and
	// UnregisterMemory moves it after removing a region: a peer holding a
	// view of this descriptor sees it stale once a listed region is gone.
	var gen uint64
	if e.ctrl != nil {
		gen = e.ctrl.Generation()
	}
	d := &metadata.SegmentDesc{
		Name:            e.name,
		Protocol:        json.RawMessage(`"tcp"`),
		TCPDataHost:     e.cfg.Host,
		TCPDataPort:     e.server.Addr().Port,
		TCPProtoVersion: 2,
		Timestamp:       time.Now().Format("2006-01-02 15:04:05.000000"),
		Buffers:         []metadata.Buffer{},
	}
	if e.cfg.TCPv1 {
		d.TCPProtoVersion = 1
	}
	var shared []metadata.SharedBuffer
	for _, r := range e.mem.inOrder() {
		if !r.remote {
			continue
		}
		// Mooncake's TCP engines name every buffer after the segment.
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: e.name, Addr: r.addr, Length: r.length})
		if r.fd >= 0 {
			shared = append(shared, metadata.SharedBuffer{Addr: r.addr, Length: r.length, FD: r.fd})
		}
	}
	if e.ctrl != nil && e.hostID != "" {
		d.Local = &metadata.LocalInfo{HostID: e.hostID, PID: os.Getpid(), StartTime: e.start,
			ControlFD: e.ctrl.FD(), Generation: &gen, Shared: shared}
	}
	return d
}

func (e *Engine) publish(ctx context.Context) error {
	b, err := json.Marshal(e.descriptor())
	if err != nil {
		return wrapf(CodeMalformedJSON, err, "encode descriptor")
	}
	if err := e.meta.Put(ctx, metadata.SegmentKey(e.name), b); err != nil {
		return wrapf(CodeMetadata, err, "publish segment %s", e.name)
	}
	return nil
}

// handshake answers the handshake socket.
func (e *Engine) handshake(typ byte, body []byte, remote net.Addr) ([]byte, error) {
	switch typ {
	case metadata.TypeMetadata:
		return json.Marshal(e.descriptor())
	case metadata.TypeNotify:
		var n Notify
		if err := json.Unmarshal(body, &n); err != nil {
			return nil, fmt.Errorf("notify from %s: %w", remote, err)
		}
		e.notifyMu.Lock()
		if len(e.notifies) >= maxNotifies {
			e.notifies = e.notifies[1:]
			e.log.Warn("notification queue full: dropped the oldest", "limit", maxNotifies)
		}
		e.notifies = append(e.notifies, n)
		e.notifyMu.Unlock()
		e.m.notifies.Inc()
		return []byte(`{"name":"","notify_msg":"success"}`), nil
	case metadata.TypeProbe:
		return []byte(`{"status":"success"}`), nil
	}
	return json.Marshal(map[string]string{"reply_msg": "connection handshake (RDMA) is not supported by this engine"})
}

// OpenSegment resolves a peer's segment by name and returns its ID; opening
// a name twice returns the same ID. This engine's own name is LocalSegment.
func (e *Engine) OpenSegment(ctx context.Context, name string) (SegmentID, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	if name == e.name {
		return LocalSegment, nil
	}
	e.segMu.Lock()
	if id, ok := e.segNames[name]; ok {
		e.segMu.Unlock()
		return id, nil
	}
	e.segMu.Unlock()
	seg, err := e.resolve(ctx, name)
	if err != nil {
		return 0, err
	}
	e.segMu.Lock()
	defer e.segMu.Unlock()
	if id, ok := e.segNames[name]; ok { // lost a race with another opener
		if seg.shm != nil {
			seg.shm.Close()
		}
		return id, nil
	}
	seg.id = e.nextSeg
	e.nextSeg++
	e.segs[seg.id] = seg
	e.segNames[name] = seg.id
	return seg.id, nil
}

func (e *Engine) resolve(ctx context.Context, name string) (*segment, error) {
	seg := &segment{name: name}
	seg.miss = func(s *transport.Slice, err error) { e.missed(seg, s, err) }
	var host string
	var desc *metadata.SegmentDesc
	if e.meta == nil {
		h, _, err := net.SplitHostPort(name)
		if err != nil {
			return nil, errorf(CodeInvalidArgument, "open segment %q: P2PHANDSHAKE names are host:port", name)
		}
		host, seg.rpcAddr = h, name
		if desc, err = e.askDescriptor(ctx, "open segment "+name, name); err != nil {
			return nil, err
		}
	} else {
		raw, err := e.meta.Get(ctx, metadata.SegmentKey(name))
		if err != nil {
			return nil, wrapf(CodeMetadata, err, "open segment %s", name)
		}
		if desc, err = metadata.ParseSegmentDesc(raw); err != nil {
			return nil, wrapf(CodeMalformedJSON, err, "open segment %s", name)
		}
		raw, err = e.meta.Get(ctx, metadata.RPCMetaKey(name))
		if err != nil {
			return nil, wrapf(CodeMetadata, err, "open segment %s: rpc_meta", name)
		}
		rpc, err := metadata.ParseRPCMeta(raw)
		if err != nil {
			return nil, wrapf(CodeMalformedJSON, err, "open segment %s", name)
		}
		host, seg.rpcAddr = rpc.IPOrHostName, net.JoinHostPort(rpc.IPOrHostName, strconv.Itoa(rpc.RPCPort))
	}
	seg.desc.Store(desc)
	// Data goes to the host the descriptor names, else the handshake host.
	if desc.TCPDataHost != "" {
		host = desc.TCPDataHost
	}
	if desc.TCPDataPort > 0 {
		seg.tcp = []string{net.JoinHostPort(host, strconv.Itoa(desc.TCPDataPort))}
	}
	if info, ok := e.shmInfo(desc); ok {
		p, err := shm.Open(info)
		if err != nil {
			e.log.Info("same-host path unavailable, using TCP", "segment", name, "err", err)
		}
		seg.shm = p
	}
	if len(seg.tcp) > 0 {
		var err error
		if seg.tcpPeer, err = e.tcp.Peer(seg.tcp); err != nil {
			if seg.shm != nil {
				seg.shm.Close()
			}
			return nil, wrapf(CodeContext, err, "open segment %s", name)
		}
	}
	switch {
	case e.cfg.Transport == "shm" && seg.shm == nil:
		return nil, errorf(CodeDeviceNotFound, "open segment %s: not reachable through shared memory", name)
	case seg.shm == nil && len(seg.tcp) == 0:
		return nil, errorf(CodeEndpoint, "open segment %s: descriptor offers no TCP data port", name)
	}
	return seg, nil
}

// askDescriptor asks the engine at rpcAddr for its current descriptor over
// the handshake socket; what names the operation in errors.
func (e *Engine) askDescriptor(ctx context.Context, what, rpcAddr string) (*metadata.SegmentDesc, error) {
	mine, _ := json.Marshal(e.descriptor())
	reply, err := metadata.Call(ctx, rpcAddr, metadata.TypeMetadata, mine, e.secret)
	if err != nil {
		return nil, wrapf(CodeSocket, err, "%s", what)
	}
	desc, err := metadata.ParseSegmentDesc(reply)
	if err != nil {
		return nil, wrapf(CodeMalformedJSON, err, "%s", what)
	}
	return desc, nil
}

// shmInfo returns what the same-host path needs of a descriptor, if the
// peer is on this host and this engine has that path.
func (e *Engine) shmInfo(desc *metadata.SegmentDesc) (shm.PeerInfo, bool) {
	l := desc.Local
	if l == nil || e.shm == nil || l.HostID != e.hostID {
		return shm.PeerInfo{}, false
	}
	info := shm.PeerInfo{PID: l.PID, StartTime: l.StartTime, ControlFD: l.ControlFD, Generation: l.Generation}
	for _, b := range l.Shared {
		info.Shared = append(info.Shared, shm.Shared{Addr: b.Addr, Length: b.Length, FD: b.FD})
	}
	for _, b := range desc.Buffers {
		info.Regions = append(info.Regions, shm.Region{Addr: b.Addr, Length: b.Length})
	}
	return info, true
}

// CloseSegment forgets an opened segment; its lanes close.
func (e *Engine) CloseSegment(id SegmentID) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if id == LocalSegment {
		return nil
	}
	e.segMu.Lock()
	seg, ok := e.segs[id]
	delete(e.segs, id)
	if ok {
		delete(e.segNames, seg.name)
	}
	e.segMu.Unlock()
	if !ok {
		return errorf(CodeInvalidArgument, "close segment %d: not open", id)
	}
	if seg.tcpPeer != nil {
		e.tcp.Forget(seg.tcpPeer)
	}
	if seg.shm != nil {
		seg.shm.Close()
	}
	return nil
}

func (e *Engine) segment(id SegmentID) *segment {
	e.segMu.Lock()
	defer e.segMu.Unlock()
	return e.segs[id]
}

// SegmentName returns the name of an opened segment.
func (e *Engine) SegmentName(id SegmentID) (string, bool) {
	if id == LocalSegment {
		return e.name, true
	}
	if s := e.segment(id); s != nil {
		return s.name, true
	}
	return "", false
}

// SegmentBuffers lists the buffers an opened segment published when it was
// opened or its view last refreshed (Mooncake's get_first_buffer_address
// reads the first).
func (e *Engine) SegmentBuffers(id SegmentID) ([]metadata.Buffer, error) {
	if id == LocalSegment {
		return e.descriptor().Buffers, nil
	}
	s := e.segment(id)
	if s == nil {
		return nil, errorf(CodeInvalidArgument, "segment %d: not open", id)
	}
	return s.desc.Load().Buffers, nil
}

// Probe checks that the engine serving segment name answers.
func (e *Engine) Probe(ctx context.Context, name string) error {
	addr, err := e.rpcAddr(ctx, name)
	if err != nil {
		return err
	}
	reply, err := metadata.Call(ctx, addr, metadata.TypeProbe, []byte(`{}`), e.secret)
	if err != nil {
		return wrapf(CodeSocket, err, "probe %s", name)
	}
	var r struct{ Status string }
	if json.Unmarshal(reply, &r) != nil || r.Status != "success" {
		return errorf(CodeRejectHandshake, "probe %s: reply %q", name, reply)
	}
	return nil
}

// rpcAddr finds the handshake address of a segment by name.
func (e *Engine) rpcAddr(ctx context.Context, name string) (string, error) {
	if name == e.name {
		return e.hs.Addr().String(), nil
	}
	e.segMu.Lock()
	if id, ok := e.segNames[name]; ok {
		a := e.segs[id].rpcAddr
		e.segMu.Unlock()
		return a, nil
	}
	e.segMu.Unlock()
	if e.meta == nil {
		if _, _, err := net.SplitHostPort(name); err != nil {
			return "", errorf(CodeInvalidArgument, "segment %q: P2PHANDSHAKE names are host:port", name)
		}
		return name, nil
	}
	raw, err := e.meta.Get(ctx, metadata.RPCMetaKey(name))
	if err != nil {
		return "", wrapf(CodeMetadata, err, "segment %s: rpc_meta", name)
	}
	rpc, err := metadata.ParseRPCMeta(raw)
	if err != nil {
		return "", wrapf(CodeMalformedJSON, err, "segment %s: rpc_meta", name)
	}
	return net.JoinHostPort(rpc.IPOrHostName, strconv.Itoa(rpc.RPCPort)), nil
}

// SendNotify delivers n to the engine serving segment name.
func (e *Engine) SendNotify(ctx context.Context, name string, n Notify) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	addr, err := e.rpcAddr(ctx, name)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(n)
	if _, err := metadata.Call(ctx, addr, metadata.TypeNotify, body, e.secret); err != nil {
		return wrapf(CodeSocket, err, "notify %s", name)
	}
	return nil
}

// Notifies returns and clears the notifications received so far, oldest
// first.
func (e *Engine) Notifies() []Notify {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	n := e.notifies
	e.notifies = nil
	return n
}

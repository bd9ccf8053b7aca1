package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/cudaipc"
	"github.com/mooncake-go/mooncake/engine/transport/shm"
	"github.com/mooncake-go/mooncake/engine/transport/stage"
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
	// extra serve the TCP data port on Config.ExtraHosts, in order.
	extra []*tcp.Server
	// paths are the data paths in order of preference: Config.Transports,
	// then CUDA IPC (unless Transport is "tcp"), GPU staging, same-host
	// shared memory and TCP (as Config.Transport allows).
	paths []transport.Transport

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
	wg      sync.WaitGroup // notify senders
	// ctx ends when Close starts: notifications in progress give up.
	ctx    context.Context
	cancel context.CancelFunc
}

// segment is an opened peer.
type segment struct {
	id      SegmentID
	name    string
	desc    atomic.Pointer[metadata.SegmentDesc] // as opened or last refreshed
	rpcAddr string
	// peers are the paths that opened this peer, in order of preference:
	// peers[0] takes every slice, and each passes what it cannot serve to
	// the one after it.
	peers []transport.Peer
}

// maxNotifies bounds undelivered notifications kept for GetNotifies.
const maxNotifies = 1 << 16

// New starts an engine: its handshake and data listeners, its data paths,
// and, outside P2PHANDSHAKE mode, its records in the metadata store. ctx
// bounds the start (publishing the records); the engine outlives it.
func New(ctx context.Context, cfg Config) (e *Engine, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := checkExtraHosts(cfg.ExtraHosts); err != nil { // from the environment
		return nil, err
	}
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
	// The caller's paths first: from here on the engine owns them, and a
	// failing New closes them too.
	e.paths = append(e.paths, cfg.Transports...)
	// GPU memory of another process on this host is reached through CUDA
	// IPC, with no socket; what that path cannot serve goes on to the
	// staging path.
	if cfg.Transport != "tcp" {
		e.paths = append(e.paths, cudaipc.New(cudaipc.Config{Logger: e.log}))
	}
	// Slices on GPU memory are staged through host buffers onto the paths
	// below; the tail slice is at most 1.25 slices.
	staged := max(cfg.SliceSize, cfg.DeviceSliceSize)
	e.paths = append(e.paths, stage.New(stage.Config{BufferSize: staged + staged/4, Logger: e.log}))
	// Undo whatever was started if a later step fails (through a copy:
	// the failing return has already set e to nil).
	started := e
	defer func() {
		if err != nil {
			started.shutdown()
			e = nil
		}
	}()
	if e.meta, err = metadata.Open(cfg.Metadata, metadata.WithToken(cfg.MetadataToken), metadata.WithTLS(cfg.MetadataTLS)); err != nil {
		return nil, &Error{Code: CodeMetadata, Err: err}
	}
	if e.server, err = tcp.Listen(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.DataPort)), tcp.ServerConfig{
		Memory: e.mem, Secret: e.secret, Logger: e.log, Served: e.m.served, MaxConnsPerPeer: cfg.MaxConnsPerPeer,
	}); err != nil {
		return nil, &Error{Code: CodeSocket, Err: err}
	}
	if err = e.listenExtra(); err != nil {
		return nil, err
	}
	if e.hs, err = metadata.ServeHandshake(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.RPCPort)), e.handshake, e.secret, e.log); err != nil {
		return nil, &Error{Code: CodeSocket, Err: err}
	}
	if cfg.Transport != "tcp" {
		t, err := shm.New(shm.Config{Timeout: cfg.Timeout, Logger: e.log, Refreshed: e.m.refreshes.Inc})
		if err != nil {
			return nil, &Error{Code: CodeMemory, Err: err}
		}
		e.paths = append(e.paths, t)
	}
	if cfg.Transport != "shm" {
		e.paths = append(e.paths, tcp.NewClient(tcp.ClientConfig{
			Lanes: cfg.Lanes, MaxRetries: cfg.MaxRetries, Secret: e.secret, V1: cfg.TCPv1, Logger: e.log,
			LocalAddrs: e.localAddrs(),
		}))
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
		ctx, cancel := context.WithTimeout(ctx, publishTimeout)
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

// listenExtra serves the TCP data port on every extra address too, on the
// primary's port number where it is free there.
func (e *Engine) listenExtra() error {
	port := e.server.Addr().Port
	scfg := tcp.ServerConfig{Memory: e.mem, Secret: e.secret, Logger: e.log, Served: e.m.served, MaxConnsPerPeer: e.cfg.MaxConnsPerPeer}
	for _, h := range e.cfg.ExtraHosts {
		s, err := tcp.Listen(net.JoinHostPort(h, strconv.Itoa(port)), scfg)
		if err != nil {
			s, err = tcp.Listen(net.JoinHostPort(h, "0"), scfg)
		}
		if err != nil {
			return wrapf(CodeSocket, err, "listen on extra host %s", h)
		}
		e.extra = append(e.extra, s)
	}
	return nil
}

// localAddrs are the addresses lanes dial from: none (the system picks)
// unless the host has extra ones.
func (e *Engine) localAddrs() []string {
	if len(e.extra) == 0 {
		return nil
	}
	var addrs []string
	if net.ParseIP(e.cfg.Host) != nil {
		addrs = append(addrs, e.cfg.Host)
	}
	for _, s := range e.extra {
		addrs = append(addrs, s.Addr().IP.String())
	}
	return addrs
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
	e.closePaths()
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

// closePaths closes the data paths, the last first: a path that hands
// slices on to the next finds it failing them, not gone. Closing a path
// twice is harmless.
func (e *Engine) closePaths() {
	for i := len(e.paths) - 1; i >= 0; i-- {
		e.paths[i].Close()
	}
}

// shutdown releases everything in reverse order of New.
func (e *Engine) shutdown() {
	e.cancel()
	e.closePaths()
	e.wg.Wait()
	e.segMu.Lock()
	for _, s := range e.segs {
		s.close()
	}
	e.segs = map[SegmentID]*segment{}
	e.segMu.Unlock()
	if e.hs != nil {
		e.hs.Close()
	}
	if e.server != nil {
		e.server.Close()
	}
	for _, s := range e.extra {
		s.Close()
	}
	if e.meta != nil {
		e.meta.Close()
	}
}

// publishTimeout bounds each update of this engine's metadata records.
const publishTimeout = 10 * time.Second

// RegisterMemory makes [addr, addr+length) usable in transfers; when
// remoteAccessible, peers may read and write it. Zero-length and
// overlapping regions are rejected (CodeAddressOverlapped), as Mooncake.
// ctx bounds publishing the new descriptor; if that fails, nothing stays
// registered.
func (e *Engine) RegisterMemory(ctx context.Context, addr uintptr, length uint64, location string, remoteAccessible bool) error {
	return e.register(ctx, uint64(addr), length, location, remoteAccessible, -1)
}

func (e *Engine) register(ctx context.Context, addr, length uint64, location string, remote bool, fd int) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	r := &region{addr: addr, length: length, location: location, remote: remote, fd: fd, dev: -1}
	if err := placeRegion(r); err != nil {
		return err
	}
	if err := e.mem.add(r); err != nil {
		return err
	}
	if err := e.republish(ctx); err != nil {
		// Registered only if peers can learn of it: undo, so the caller
		// may free the memory it failed to register.
		if _, rerr := e.mem.remove(addr); rerr == nil {
			e.unregistered()
		}
		return err
	}
	return nil
}

// unregistered tells the paths that publish a region was removed.
func (e *Engine) unregistered() {
	for _, p := range e.paths {
		if p, ok := p.(transport.Publisher); ok {
			p.Unregistered()
		}
	}
}

// UnregisterMemory removes the region registered at addr. It returns once
// no transfer serving a peer touches the region any more. The region is
// gone even when publishing the new descriptor fails (the error says so):
// peers that still see it are refused. ctx's values reach the publishing,
// its end does not cut it short, since the removal is done.
func (e *Engine) UnregisterMemory(ctx context.Context, addr uintptr) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if _, err := e.mem.remove(uint64(addr)); err != nil {
		return err
	}
	e.unregistered()
	if err := e.republish(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("unregistered %#x, but peers may still list it: %w", addr, err)
	}
	return nil
}

func (e *Engine) republish(ctx context.Context) error {
	if e.meta == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return e.publish(ctx)
}

// descriptor is this engine's segment descriptor as peers see it.
func (e *Engine) descriptor() *metadata.SegmentDesc {
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
	for _, s := range e.extra {
		d.TCPDataAddrs = append(d.TCPDataAddrs, s.Addr().String())
	}
	// Every path publishing its part reads what it must before the
	// regions are listed (transport.Publisher), then gets the list.
	var finish []func([]transport.LocalRegion)
	for _, p := range e.paths {
		if p, ok := p.(transport.Publisher); ok {
			finish = append(finish, p.Publish(d))
		}
	}
	var listed []transport.LocalRegion
	for _, r := range e.mem.inOrder() {
		if !r.remote {
			continue
		}
		// Mooncake's TCP engines name every buffer after the segment.
		b := metadata.Buffer{Name: e.name, Addr: r.addr, Length: r.length}
		if r.onDevice() {
			b.Location = r.location
		}
		d.Buffers = append(d.Buffers, b)
		listed = append(listed, transport.LocalRegion{Addr: r.addr, Length: r.length, FD: r.fd, Device: r.dev + 1})
	}
	for _, f := range finish {
		f(listed)
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
		seg.close()
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
	var addrs []string
	if desc.TCPDataPort > 0 {
		addrs = append(addrs, net.JoinHostPort(host, strconv.Itoa(desc.TCPDataPort)))
	}
	addrs = append(addrs, desc.TCPDataAddrs...)
	if err := e.openPaths(ctx, seg, addrs); err != nil {
		return nil, err
	}
	return seg, nil
}

// openPaths offers the peer to every data path, the last first, so each
// path gets the one after it as the place to pass on what it cannot serve.
func (e *Engine) openPaths(ctx context.Context, seg *segment, addrs []string) error {
	info := transport.PeerInfo{
		Name:  seg.name,
		Desc:  seg.desc.Load(),
		Addrs: addrs,
		Describe: func(ctx context.Context) (*metadata.SegmentDesc, error) {
			desc, err := e.askDescriptor(ctx, "refresh segment "+seg.name, seg.rpcAddr)
			if err == nil {
				seg.desc.Store(desc)
			}
			return desc, err
		},
	}
	var open []transport.Peer // in the order opened: the last path first
	for i := len(e.paths) - 1; i >= 0; i-- {
		p, err := e.paths[i].Open(ctx, info)
		if errors.Is(err, transport.ErrUnavailable) {
			continue
		}
		if err != nil {
			for _, p := range open {
				p.Close()
			}
			return wrapf(CodeContext, err, "open segment %s: %s path", seg.name, e.paths[i].Name())
		}
		open = append(open, p)
		info.Next = p
	}
	if len(open) == 0 {
		if e.cfg.Transport == "shm" {
			return errorf(CodeDeviceNotFound, "open segment %s: not reachable through shared memory", seg.name)
		}
		return errorf(CodeEndpoint, "open segment %s: descriptor offers no TCP data port", seg.name)
	}
	slices.Reverse(open)
	seg.peers = open
	return nil
}

// close releases the segment's paths.
func (seg *segment) close() {
	for _, p := range seg.peers {
		p.Close()
	}
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

// CloseSegment forgets an opened segment and closes its paths (TCP lanes
// that another open segment shares with it stay open for that one).
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
	seg.close()
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

package master

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/mooncake-go/mooncake/engine/transport/conn"
	"github.com/mooncake-go/mooncake/internal/etcdopt"
	"github.com/mooncake-go/mooncake/internal/framerpc"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Service configures the metadata service.
	Service ServiceConfig
	// Listen is the gRPC address. Zero: ":50051", Mooncake's port.
	Listen string
	// HA, when set, makes this master one of several: it serves only while
	// it leads, journaling every durable change to etcd.
	HA *HAConfig
	// Persist, when set, keeps a master without HA's state on local disk
	// across restarts: a journal of every durable change plus snapshots
	// (persist.go). Not with HA, whose journal is in etcd.
	Persist *PersistConfig
	// Admin is the address of the HTTP admin server (/metrics, /health,
	// /role, /leader, /get_all_segments, /query_key, ...: admin.go),
	// Mooncake's --metrics_port. Zero: none.
	Admin string
	// Logger receives the server's logs. Zero: slog.Default().
	Logger *slog.Logger
	// KVEvents, when set, publishes KV events over ZMQ while this master
	// leads (kvevents.go), as mooncake_master --enable_kv_events. Zero:
	// none.
	KVEvents *KVEventsConfig
	// MaxRecvMsgSize is the largest request accepted (gRPC or framed), in
	// bytes; a larger one fails with ResourceExhausted before it is decoded. Zero:
	// DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// MaxConcurrentStreams is the most calls one client connection may
	// have in flight; a gRPC client queues the rest, a framed connection
	// is not read further until one ends. Zero:
	// DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxAdminBody is the largest request body the admin HTTP server
	// accepts, in bytes; a larger one is answered 413. Zero:
	// DefaultMaxAdminBody.
	MaxAdminBody int64
	// MaxConns and MaxConnsPerPeer cap the client connections (gRPC and
	// framed) open at once,
	// in all and from one IP address: with MaxConcurrentStreams they bound
	// the calls and streams clients can hold. Connections over them are
	// closed as they are accepted, and logged. Zero: DefaultMaxConns,
	// DefaultMaxConnsPerPeer.
	MaxConns, MaxConnsPerPeer int
	// TLS makes the gRPC and admin servers speak TLS with its certificate;
	// its CAFile makes it mutual: a client must present a certificate that
	// CA signed. Zero: plaintext, as Mooncake's master.
	TLS secure.TLS
	// Token, when set, is the bearer token every gRPC call and admin
	// request must carry ("authorization: Bearer <token>"); others are
	// answered codes.Unauthenticated or 401. Zero: none, as Mooncake's.
	Token string
	// OpenProbes lets /health, /readyz and /metrics of the admin server
	// answer without the Token, for probes and scrapers that cannot
	// present one. Every other endpoint still requires it.
	OpenProbes bool
}

// Limits of the master's servers (ServerConfig).
const (
	// DefaultMaxRecvMsgSize bounds a gRPC request: a batch of
	// DefaultMaxBatch keys of MaxKeyLen bytes fits.
	DefaultMaxRecvMsgSize = 256 << 20
	// DefaultMaxConcurrentStreams bounds the calls in flight on one
	// client connection.
	DefaultMaxConcurrentStreams = 1024
	// DefaultMaxAdminBody bounds an admin HTTP request's body: every
	// endpoint takes its parameters in the query, so any body is a
	// mistake or an attack.
	DefaultMaxAdminBody = 64 << 10
	// DefaultMaxConns bounds the gRPC connections: a store client keeps
	// one to the master.
	DefaultMaxConns = 16384
	// DefaultMaxConnsPerPeer bounds those from one host.
	DefaultMaxConnsPerPeer = 1024
)

// adminLimits bound the admin HTTP server's connections: scrapers and
// operators hold a few.
var adminLimits = conn.Limits{Total: 1024, PerPeer: 64}

// HAConfig configures leader election and the journal.
type HAConfig struct {
	// Etcd lists the etcd endpoints ("host:port").
	Etcd []string
	// ClusterID names the cluster. Zero: "mooncake_cluster".
	ClusterID string
	// Advertise is the address clients reach this master at. Zero: the
	// listener's address; a port of 0 (or none) takes the listener's port.
	Advertise string
	// LeaderTTL is the lease of the leader key: how long a dead leader
	// keeps the cluster without one. Zero: ha.DefaultTTL.
	LeaderTTL time.Duration
	// SnapshotEvery is the number of journal records after which the
	// leader writes a snapshot and trims the log. Zero: 100000, or four
	// per object the master holds, whichever is more (snapshotDue).
	SnapshotEvery int
	// EtcdTLS is how the master dials etcd over TLS. Zero: plaintext.
	EtcdTLS secure.TLS
	// Client, when not nil, is the etcd client to use instead of dialling
	// Etcd: an etcd in the same process (mooncake up's) is called in
	// process (embedetcd.Etcd.Client), so a put's journal write skips
	// gRPC over loopback TCP. The Server closes it, and so does a Start
	// that fails.
	Client *clientv3.Client
	// ColdStandby makes a standby wait without following the journal: it
	// holds no copy of the state, and loads the snapshot and the whole log
	// after it when it wins (seconds for a large state, where a warm
	// standby serves within one: standby.go). Zero: warm.
	ColdStandby bool
	// SyncEtcd makes a put wait for its record to be in etcd, always. Zero:
	// a warm standby that keeps up is designated, and its acknowledgement
	// makes a record durable, with etcd written behind (replicate.go);
	// under TLS only with TLSStandbyAcks.
	SyncEtcd bool
	// TLSStandbyAcks lets a master serving TLS acknowledge as a standby,
	// fetching over TLS with its own certificate. A next leader must then
	// be able to ask the designated standby for the records it
	// acknowledged, so every master of the cluster needs it (all of this
	// version), with a certificate that names its address (or
	// PeerServerName) and, under
	// mutual TLS, is valid for client authentication and signed by the CA
	// the masters trust: Start checks its own (secure.TLS.CheckPeer). Zero:
	// under TLS every put waits for etcd.
	TLSStandbyAcks bool
	// PeerServerName, under TLS, is the name the masters verify one
	// another's certificates for, instead of the address each advertises:
	// one certificate for every master (a Kubernetes Service's name, say,
	// where pods advertise addresses no certificate names ahead). Zero:
	// the advertised host. The same on every master: a next leader
	// verifies the designated standby as its own setting says, so set it
	// on every master before TLSStandbyAcks.
	PeerServerName string
}

// DefaultListen is the master's default gRPC address.
const DefaultListen = ":50051"

// Server is a running master: the Service, its background loop and its
// gRPC front on one listener. Under HA it campaigns for leadership, and
// while it leads serves a Service restored from the journal.
type Server struct {
	cfg    ServerConfig
	lis    net.Listener
	grpc   *grpc.Server
	frames *framerpc.Server // the same calls as frames
	tlsCfg *tls.Config      // nil: plaintext
	peer   peerConfig       // how it dials the other masters
	api    *GRPCServer
	log    *slog.Logger
	etcd   *clientv3.Client

	metrics *metrics
	admin   *http.Server
	adminLn net.Listener
	kv      *kvPublisher // nil without KV events

	svc     atomic.Pointer[Service]
	leading atomic.Bool
	term    atomic.Int64
	snapSeq atomic.Uint64 // the seq of the last snapshot this server wrote
	local   *fileJournal  // the journal on local disk (Persist); nil otherwise
	elected atomic.Int64  // UnixNano of the last election this server won (HA)
	tails   *tailStore    // the records fetched as a standby (HA; replicate.go)

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// ListenError is a Start that could not listen on one of its addresses;
// errors.Is(err, syscall.EADDRINUSE) tells an address another socket holds.
type ListenError struct {
	Listener string // "rpc" (ServerConfig.Listen) or "admin" (ServerConfig.Admin)
	Addr     string
	Err      error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("master: %s listen %s: %v", e.Listener, e.Addr, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// Start starts a master serving on cfg.Listen. An HAConfig.Client is the
// Server's from the call on: a Start that fails closes it too.
func Start(cfg ServerConfig) (_ *Server, err error) {
	if h := cfg.HA; h != nil && h.Client != nil {
		defer func() {
			if err != nil {
				_ = h.Client.Close() // a no-op once closeEtcd closed it
			}
		}()
	}
	if err := cfg.Service.Validate(); err != nil {
		return nil, err
	}
	if cfg.KVEvents != nil {
		if err := cfg.KVEvents.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.MaxRecvMsgSize < 0 {
		return nil, fmt.Errorf("master: ServerConfig.MaxRecvMsgSize is negative (%d)", cfg.MaxRecvMsgSize)
	}
	if cfg.MaxAdminBody < 0 {
		return nil, fmt.Errorf("master: ServerConfig.MaxAdminBody is negative (%d)", cfg.MaxAdminBody)
	}
	if cfg.MaxConns < 0 || cfg.MaxConnsPerPeer < 0 {
		return nil, fmt.Errorf("master: ServerConfig.MaxConns (%d) or MaxConnsPerPeer (%d) is negative", cfg.MaxConns, cfg.MaxConnsPerPeer)
	}
	if p := cfg.Persist; p != nil {
		if cfg.HA != nil {
			return nil, errors.New("master: ServerConfig.Persist and HA are exclusive: under HA the journal is in etcd")
		}
		if err := p.Validate(); err != nil {
			return nil, err
		}
		p.withDefaults()
	}
	cfg.Listen = cmp.Or(cfg.Listen, DefaultListen)
	cfg.Service = cfg.Service.withTenants() // one set of quotas for every term (tenant_quota.go)
	cfg.MaxRecvMsgSize = cmp.Or(cfg.MaxRecvMsgSize, DefaultMaxRecvMsgSize)
	cfg.MaxConcurrentStreams = cmp.Or(cfg.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	cfg.MaxAdminBody = cmp.Or(cfg.MaxAdminBody, DefaultMaxAdminBody)
	cfg.MaxConns = cmp.Or(cfg.MaxConns, DefaultMaxConns)
	cfg.MaxConnsPerPeer = cmp.Or(cfg.MaxConnsPerPeer, DefaultMaxConnsPerPeer)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tlsCfg, err := cfg.TLS.Server()
	if err != nil {
		return nil, fmt.Errorf("master: ServerConfig.TLS: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, peer: peerConfig{token: cfg.Token}}
	if tlsCfg != nil {
		// The other masters serve TLS too: verified with the CA of
		// cfg.TLS (or the system's roots), this master's certificate
		// presented to those that ask for one (mutual TLS).
		peer := cfg.TLS
		peer.ServerName = ""
		if cfg.HA != nil {
			peer.ServerName = cfg.HA.PeerServerName
		}
		if s.peer.tls, err = peer.Client(); err != nil {
			return nil, fmt.Errorf("master: ServerConfig.TLS, to dial the other masters: %w", err)
		}
	}
	if h := cfg.HA; h != nil {
		if len(h.Etcd) == 0 && h.Client == nil {
			return nil, errors.New("master: HA needs etcd endpoints")
		}
		h.ClusterID = cmp.Or(h.ClusterID, "mooncake_cluster")
		if s.etcd = h.Client; s.etcd == nil {
			ecfg, err := etcdopt.ConfigTLS(h.Etcd, 5*time.Second, h.EtcdTLS)
			if err != nil {
				return nil, fmt.Errorf("master: %w", err)
			}
			if s.etcd, err = clientv3.New(ecfg); err != nil {
				return nil, fmt.Errorf("master: etcd %v: %w", h.Etcd, err)
			}
		}
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		s.closeEtcd()
		return nil, &ListenError{Listener: "rpc", Addr: cfg.Listen, Err: err}
	}
	s.lis = conn.Limit(lis, conn.Limits{Total: cfg.MaxConns, PerPeer: cfg.MaxConnsPerPeer}, s.log.With("listener", "rpc"))
	if err := s.checkPeerTLS(); err != nil {
		_ = lis.Close()
		s.closeEtcd()
		return nil, err
	}
	if cfg.KVEvents != nil {
		if s.kv, err = startKVPublisher(*cfg.KVEvents, s.advertise(), s.log); err != nil {
			_ = lis.Close()
			s.closeEtcd()
			return nil, err
		}
	}
	s.api = NewGRPCServer(nil)
	s.api.serve(nil)
	s.metrics = newMetrics(s)
	s.grpc = grpc.NewServer(s.grpcOptions(tlsCfg)...)
	// Clients send their unary calls as frames on the same port
	// (internal/framerpc), inside TLS when it serves TLS, through the
	// same interceptors.
	s.frames = framerpc.NewServer(framerpc.ServerConfig{Interceptor: framerpc.ChainUnary(s.unaryInterceptors()...),
		MaxRecvMsgSize: cfg.MaxRecvMsgSize, MaxConcurrentCalls: int(min(cfg.MaxConcurrentStreams, 1<<20)), Log: s.log})
	s.tlsCfg = tlsCfg
	if cfg.Admin != "" {
		if s.adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
			_ = lis.Close()
			s.closeKV()
			s.closeEtcd()
			return nil, &ListenError{Listener: "admin", Addr: cfg.Admin, Err: err}
		}
		s.admin = &http.Server{Handler: s.adminAuth(limitBody(cfg.MaxAdminBody, s.adminHandler())), ReadHeaderTimeout: 10 * time.Second}
		var admin net.Listener = conn.Limit(s.adminLn, adminLimits, s.log.With("listener", "admin"))
		if tlsCfg != nil {
			admin = tls.NewListener(admin, tlsCfg)
		}
		s.wg.Go(func() { _ = s.admin.Serve(admin) })
	}
	for _, reg := range s.registrars() {
		s.api.Register(reg)
		storepb.RegisterTierServer(reg, &TierServer{g: s.api}) // SSD tiers across node restarts (tier_announce.go)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if cfg.HA == nil {
		var svc *Service
		if cfg.Persist != nil {
			svc, s.local, err = openLocal(*cfg.Persist, cfg.Service, s.log)
		} else {
			svc, err = NewService(cfg.Service)
		}
		if err != nil {
			cancel()
			_ = lis.Close()
			if s.admin != nil {
				_ = s.admin.Close()
			}
			s.wg.Wait()
			s.closeKV()
			s.closeEtcd()
			return nil, err
		}
		s.lead(svc)
		s.wg.Go(func() { _ = svc.Run(ctx) })
		if s.local != nil {
			s.wg.Go(func() { s.persistLoop(ctx, svc, s.local) })
		}
	} else {
		s.tails = &tailStore{id: newStandbyID(), addr: s.advertise()}
		s.api.tails.Store(s.tails)
		s.wg.Go(func() { s.campaign(ctx) })
	}
	// Split serves framed calls from here on, as Serve does gRPC's: not
	// before, for a call must find its method registered (a framed
	// server's RegisterService is not safe against calls running) and,
	// without HA, the service leading.
	glis := framerpc.SplitTLS(s.lis, s.frames, s.tlsCfg)
	s.wg.Go(func() {
		if err := s.grpc.Serve(glis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("master: gRPC server stopped", "err", err)
		}
	})
	s.log.Info("master: listening", "addr", lis.Addr().String(), "ha", cfg.HA != nil,
		"tls", tlsCfg != nil, "mutual_tls", cfg.TLS.CAFile != "", "token", cfg.Token != "")
	if s.kv != nil {
		s.log.Info("master: publishing KV events", "endpoint", s.KVEventsAddr(),
			"replay", s.KVEventsReplayAddr(), "backend_id", s.kv.backendID)
	}
	return s, nil
}

// grpcOptions are the gRPC server's options: its limits, keep-alive
// policy, TLS (nil: none) and interceptors, the token's first so that a
// call without it reaches nothing else.
func (s *Server) grpcOptions(tlsCfg *tls.Config) []grpc.ServerOption {
	cfg := s.cfg
	unary := s.unaryInterceptors()
	var stream []grpc.StreamServerInterceptor
	if cfg.Token != "" {
		stream = append(stream, secure.StreamServerInterceptor(cfg.Token))
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize), grpc.MaxSendMsgSize(256 << 20),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		// Clients ping every 10 s, idle or not, to find a connection cut
		// off silently (store/client master.go); gRPC's default policy
		// (5 min, not when idle) would answer that with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}
	if tlsCfg != nil {
		// SplitTLS handshakes every connection, and sorts frames from
		// gRPC's inside it.
		opts = append(opts, grpc.Creds(framerpc.Handshaken(tlsCfg)))
	}
	return opts
}

// unaryInterceptors run around every unary call, over gRPC or frames:
// the token's first, so that a call without it reaches nothing else.
func (s *Server) unaryInterceptors() []grpc.UnaryServerInterceptor {
	unary := []grpc.UnaryServerInterceptor{s.api.unaryStandby, s.metrics.interceptor}
	if s.cfg.Token != "" {
		unary = append([]grpc.UnaryServerInterceptor{secure.UnaryServerInterceptor(s.cfg.Token)}, unary...)
	}
	return unary
}

// registrars are the servers the services register on.
func (s *Server) registrars() []grpc.ServiceRegistrar {
	return []grpc.ServiceRegistrar{s.grpc, s.frames}
}

// adminAuth requires the Token on the admin server, but on /health,
// /readyz and /metrics with OpenProbes (read-only, and what probes and
// scrapers ask).
func (s *Server) adminAuth(h http.Handler) http.Handler {
	var open func(*http.Request) bool
	if s.cfg.OpenProbes {
		open = func(r *http.Request) bool {
			return r.Method == http.MethodGet && (r.URL.Path == "/health" || r.URL.Path == "/readyz" || r.URL.Path == "/metrics")
		}
	}
	return secure.RequireHTTP(s.cfg.Token, open, h)
}

// advertise is the address clients reach this master at: HAConfig's
// Advertise (a port of 0, or none, taking the listener's), else the
// listener's address.
func (s *Server) advertise() string {
	addr := s.lis.Addr().String()
	if h := s.cfg.HA; h != nil && h.Advertise != "" {
		host, port, err := net.SplitHostPort(h.Advertise)
		if err != nil {
			host, port = h.Advertise, "0"
		}
		if port == "0" {
			_, port, _ = net.SplitHostPort(addr)
		}
		addr = net.JoinHostPort(host, port)
	}
	return addr
}

// lead makes svc the service that answers, and that publishes the KV
// events: only the leader's changes are the store's.
func (s *Server) lead(svc *Service) {
	if s.kv != nil {
		svc.kv.Store(s.kv)
	}
	s.svc.Store(svc)
	s.api.serve(svc)
	s.leading.Store(true)
}

// campaign is the HA loop: win an election, load the journal, serve until
// the leadership or the journal is lost, step down, and again.
func (s *Server) campaign(ctx context.Context) {
	h := s.cfg.HA
	addr := s.advertise()
	for ctx.Err() == nil {
		var f *follower
		if !h.ColdStandby {
			f = startFollower(s.etcd, h.ClusterID, s.cfg.Service, s.fetchConfig(), s.tails, s.log)
		}
		l, err := ha.Campaign(ctx, s.etcd, h.ClusterID, addr, h.LeaderTTL)
		if err != nil {
			if f != nil {
				f.stop()
			}
			if ctx.Err() == nil {
				s.log.Warn("master: campaign failed; retrying", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		s.elected.Store(time.Now().UnixNano())
		if err := s.term1(ctx, l, f); err != nil && ctx.Err() == nil {
			s.log.Warn("master: stepped down", "term", l.Term(), "err", err)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Resign(rctx)
		cancel()
	}
}

// checkPeerTLS refuses HAConfig.TLSStandbyAcks with a certificate the
// other masters could not use: a standby whose certificate a next leader
// cannot verify at its address (or for PeerServerName), or a leader a
// standby would not take as a
// client, could not hand over, or ask for, the records a standby
// acknowledged.
func (s *Server) checkPeerTLS() error {
	h := s.cfg.HA
	if h == nil || s.peer.tls == nil || !h.TLSStandbyAcks || h.SyncEtcd {
		return nil
	}
	host, _, _ := net.SplitHostPort(s.advertise())
	if h.PeerServerName != "" {
		host = h.PeerServerName
	}
	if err := s.cfg.TLS.CheckPeer(host); err != nil {
		if h.PeerServerName == "" {
			return fmt.Errorf("master: HAConfig.TLSStandbyAcks: %w (for a name every master's certificate carries instead, HAConfig.PeerServerName)", err)
		}
		return fmt.Errorf("master: HAConfig.TLSStandbyAcks: %w", err)
	}
	return nil
}

// fetchConfig is how this master's followers fetch the leader's records:
// not with SyncEtcd, nor under TLS without TLSStandbyAcks.
func (s *Server) fetchConfig() fetchConfig {
	h := s.cfg.HA
	return fetchConfig{enabled: !h.SyncEtcd && (s.tlsCfg == nil || h.TLSStandbyAcks), peer: s.peer}
}

// term1 serves one leadership term; f, when not nil, is the follower of
// the journal this master ran as a standby.
func (s *Server) term1(ctx context.Context, l *ha.Leadership, f *follower) error {
	h := s.cfg.HA
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The last leader's designated standby may hold records etcd lacks.
	d, err := insync(lctx, s.etcd, h.ClusterID)
	if err != nil {
		if f != nil {
			f.stop()
		}
		return err
	}
	svc, st, last, warm, err := s.takeOver(lctx, l.Term(), f, d)
	if err == nil {
		err = clearInsync(lctx, s.etcd, h.ClusterID, l.Term())
	}
	cancel()
	if err != nil {
		return err
	}
	// The records loaded after the snapshot count towards the next one:
	// counted from zero each term, a cluster failing over more often than
	// every SnapshotEvery records never wrote one, and each leader loaded
	// a longer log (store/chaos found failovers taking 11 s, then 55 s).
	j := newEtcdJournal(s.etcd, h.ClusterID, l.Term(), last, st.snapSeq, !h.SyncEtcd)
	svc.j = j
	defer j.close()
	s.term.Store(l.Term())
	s.lead(svc)
	stats := svc.Stats()
	s.log.Info("master: leading", "term", l.Term(), "addr", s.lis.Addr().String(), "records", last, "warm", warm,
		"objects", stats.Keys, "segments", stats.Segments, "moves", len(st.moves), "load", time.Since(start).Round(time.Millisecond))
	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = svc.Run(tctx) })
	defer func() {
		s.leading.Store(false)
		svc.kv.Store(nil) // a master that stepped down publishes nothing
		s.api.serve(nil)
		svc.endWatches()
		stop()
		wg.Wait()
	}()
	// A snapshot ends with the leadership: a master that lost it must not
	// go on writing one (and serving meanwhile).
	lctx, lost := context.WithCancel(ctx)
	defer lost()
	go func() {
		select {
		case <-l.Lost():
			lost()
		case <-lctx.Done():
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.Lost():
			return errors.New("leadership lost")
		case <-tick.C:
			if err := j.failure(); err != nil {
				return err
			}
			if snapshotDue(j.pendingSnapshot(), h.SnapshotEvery, svc) {
				start := time.Now()
				seq, err := j.writeSnapshot(lctx, svc)
				s.metrics.snapshotWritten(start, err)
				if err != nil {
					return fmt.Errorf("snapshot: %w", err)
				}
				s.snapSeq.Store(seq)
				s.log.Info("master: snapshot written", "term", l.Term(), "seq", seq)
			}
		}
	}
}

// takeOver builds the service a new leader serves and returns it with the
// state and last record it holds: the follower's state brought up to date
// (warm; its prepared service when nothing came since), or else the
// journal loaded from scratch.
func (s *Server) takeOver(ctx context.Context, term int64, f *follower, insync string) (*Service, *state, uint64, bool, error) {
	h := s.cfg.HA
	var (
		st   *state
		last uint64
		warm bool
		err  error
	)
	// Stop acknowledging first: the tail must hold every record this
	// standby acknowledged.
	var prepared *Service
	var at uint64
	if f != nil {
		st, last, prepared, at = f.stop()
	}
	// The records the last leader acknowledged through its designated
	// standby and had not written: into etcd, before the journal loads.
	tail, err := tailOf(ctx, s.tails, insync, s.peer, s.log)
	if err != nil {
		return nil, nil, 0, false, err
	}
	n, err := writeTail(ctx, s.etcd, h.ClusterID, term, tail)
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("master: journal: write the records the designated standby fetched: %w", err)
	}
	if n > 0 {
		s.log.Info("master: wrote the records the last leader's standby had and etcd lacked", "term", term, "records", n)
	}
	if f != nil {
		if st != nil {
			last, err = continueJournal(ctx, s.etcd, h.ClusterID, term, st, last)
			switch {
			case err == nil && prepared != nil && at == last:
				prepared.cfg.ViewVersion = uint64(term)
				prepared.refresh()
				// As NewService does: the quotas as the store holds them
				// now (the leader may have changed them since the
				// prepare, which the journal does not show).
				prepared.cfg.Tenants.reload()
				return prepared, st, last, true, nil
			case err == nil:
				warm = true
			case errors.Is(err, errBehindSnapshot):
				st = nil
			default:
				return nil, nil, 0, false, err
			}
		}
	}
	if st == nil {
		if st, last, err = loadJournal(ctx, s.etcd, h.ClusterID, term); err != nil {
			return nil, nil, 0, false, err
		}
	}
	cfg := s.cfg.Service
	cfg.ViewVersion = uint64(term)
	svc, err := NewService(cfg)
	if err == nil {
		err = svc.restore(st)
	}
	return svc, st, last, warm, err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// Addr is the address the master listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Service is the metadata service of the current term (nil before this
// master first leads).
func (s *Server) Service() *Service { return s.svc.Load() }

// Leading reports whether this master serves: always without HA, while it
// leads with it.
func (s *Server) Leading() bool { return s.leading.Load() }

// AdminAddr is the admin HTTP server's address ("" without one).
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// KVEventsAddr is the endpoint the KV events PUB socket is bound to, its
// port resolved ("" without KV events).
func (s *Server) KVEventsAddr() string {
	if s.kv == nil {
		return ""
	}
	return endpoint(s.kv.pub)
}

// KVEventsReplayAddr is the endpoint of the KV events replay socket ("" without one).
func (s *Server) KVEventsReplayAddr() string {
	if s.kv == nil {
		return ""
	}
	return endpoint(s.kv.router)
}

// Term is the current or last leadership term under HA (0 without).
func (s *Server) Term() int64 { return s.term.Load() }

// SnapshotSeq is the journal sequence number of the last snapshot this
// server wrote while leading, once it is in etcd (0: none yet). Tests wait
// on it rather than on the snapshot ticker.
func (s *Server) SnapshotSeq() uint64 { return s.snapSeq.Load() }

// Close stops serving (calls in progress are cut), resigns the leadership
// and waits for the server's goroutines. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.grpc.Stop()
		if s.frames != nil {
			s.frames.Close()
		}
		if s.admin != nil {
			_ = s.admin.Close()
		}
		s.cancel()
		s.wg.Wait()
		if s.local != nil {
			s.local.close()
		}
		s.closeKV()
		s.closeEtcd()
	})
	return nil
}

func (s *Server) closeKV() {
	if s.kv != nil {
		s.kv.close()
	}
}

func (s *Server) closeEtcd() {
	if s.etcd != nil {
		_ = s.etcd.Close()
	}
}

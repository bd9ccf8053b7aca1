package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/etcdopt"
	"github.com/mooncake-go/mooncake/internal/framerpc"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/masterview"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// masterConn is the client's line to the leading master. With one master
// the address is fixed and gRPC reconnects by itself; under HA the leader
// is looked up in etcd again whenever a call finds no master serving
// (codes.Unavailable: the process is gone, or a standby answered).
type masterConn struct {
	etcd    *clientv3.Client // nil: fixed address
	cluster string
	timeout time.Duration

	opts  []grpc.DialOption // credentials: TLS or none, and the token
	creds []credentials.PerRPCCredentials
	// framed sends unary calls as frames (internal/framerpc), inside TLS
	// with MasterTLS: not with Config.MasterGRPC.
	framed bool
	tls    *tls.Config // MasterTLS's; nil: plaintext

	mu     sync.Mutex
	addr   string
	conn   *grpc.ClientConn
	frames *framerpc.Conn           // nil unless framed
	cc     grpc.ClientConnInterface // the frames, or conn: for other services' clients
	rpc    storepb.MasterClient
	gen    uint64 // bumped by each reconnect
	closed bool   // by close: no connection may be installed after it
}

// errMasterClosed is the error of a call racing the client's Close.
var errMasterClosed = errors.New("client: master connection closed")

func dialMaster(ctx context.Context, cfg *Config) (*masterConn, error) {
	m := &masterConn{cluster: cfg.ClusterID, timeout: cfg.RPCTimeout}
	opts, creds, tc, err := credentialOptions(cfg)
	if err != nil {
		return nil, err
	}
	m.opts, m.creds, m.tls = opts, creds, tc
	m.framed = !cfg.MasterGRPC
	if strings.HasPrefix(cfg.Master, "etcd://") {
		eps := metadata.EtcdEndpoints(cfg.Master)
		ecfg, err := etcdopt.ConfigTLS(eps, 5*time.Second, cfg.EtcdTLS)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		cli, err := clientv3.New(ecfg)
		if err != nil {
			return nil, fmt.Errorf("client: etcd %v: %w", eps, err)
		}
		m.etcd = cli
	} else {
		m.addr = cfg.Master
	}
	if _, _, err := m.current(ctx); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// credentialOptions are the dial options that present cfg's credentials
// to the master: TLS (MasterTLS) or plaintext, and the per-call ones (the
// bearer token, the tenant), which it also returns for framed calls, with
// the TLS configuration (nil: plaintext).
func credentialOptions(cfg *Config) ([]grpc.DialOption, []credentials.PerRPCCredentials, *tls.Config, error) {
	tc, err := cfg.MasterTLS.Client()
	if err != nil {
		// The caller's settings: a file missing, a server name without TLS.
		return nil, nil, nil, &storepb.Error{Code: storepb.InvalidParams, Msg: "client: Config.MasterTLS", Err: err}
	}
	tcreds := insecure.NewCredentials()
	if tc != nil {
		tcreds = credentials.NewTLS(tc)
	}
	var creds []credentials.PerRPCCredentials
	if cfg.Token != "" {
		creds = append(creds, secure.PerRPC(cfg.Token))
	}
	if cfg.TenantID != "" {
		creds = append(creds, tenantCredentials(cfg.TenantID))
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(tcreds)}
	for _, c := range creds {
		opts = append(opts, grpc.WithPerRPCCredentials(c))
	}
	return opts, creds, tc, nil
}

// masterKeepalive pings the master while calls or streams are open, and
// when idle: a connection cut off silently (a partition, not a dead
// process) then fails its calls with codes.Unavailable, and call looks the
// leader up again. gRPC pings no more often than every 10 s, so this is
// the backstop (for a WatchObjects stream, say); the heartbeat's ping,
// with its own deadline, finds a silent master sooner (errNoAnswer). The
// master permits pings this often.
var masterKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}

// errNoAnswer marks a call the master did not answer within a deadline
// the client set itself to probe it (the heartbeat's ping): the
// connection is in doubt, and the next call looks the leader up again. A
// caller's own short deadline passing says nothing of the connection and
// keeps it.
var errNoAnswer = errors.New("the master did not answer in time")

// current returns the connection in use, dialing the leader if there is
// none. The leader is looked up without holding mu: with etcd unreachable
// the lookup lasts as long as ctx, and every other call (each with its own
// deadline, some served from the lease cache) would otherwise queue behind
// it, past their deadlines (internal/faults TestEtcdUnavailable).
func (m *masterConn) current(ctx context.Context) (storepb.MasterClient, uint64, error) {
	m.mu.Lock()
	if m.rpc != nil {
		defer m.mu.Unlock()
		return m.rpc, m.gen, nil
	}
	addr := m.addr
	m.mu.Unlock()
	if m.etcd != nil {
		a, _, err := masterview.Leader(ctx, m.etcd, m.cluster)
		if err != nil {
			return nil, 0, err
		}
		addr = a
	}
	conn, err := grpc.NewClient(addr, slices.Concat(m.opts, []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)),
		grpc.WithKeepaliveParams(masterKeepalive),
		// A reconnection to a master cut off hangs in connect (its SYNs
		// dropped), and calls wait for it to their deadline: give up on
		// a connect after 2 s, so that they fail with codes.Unavailable
		// and call looks the leader up again.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: 2 * time.Second})})...)
	if err != nil {
		return nil, 0, fmt.Errorf("client: master %s: %w", addr, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		_ = conn.Close()
		return nil, 0, errMasterClosed
	case m.rpc != nil: // another call dialed meanwhile: use its connection
		_ = conn.Close()
		return m.rpc, m.gen, nil
	}
	var cc grpc.ClientConnInterface = conn
	if m.framed {
		m.frames = framerpc.NewConn(framerpc.ConnConfig{Addr: addr, GRPC: conn, Creds: m.creds, TLS: m.tls, DialTimeout: 2 * time.Second})
		cc = m.frames
	}
	m.conn, m.cc, m.rpc = conn, cc, storepb.NewMasterClient(cc)
	m.gen++
	return m.rpc, m.gen, nil
}

// drop forgets connection gen so the next call looks the leader up again.
func (m *masterConn) drop(gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.conn == nil {
		return
	}
	m.closeConn()
}

// closeConn closes the connection in use; under mu.
func (m *masterConn) closeConn() {
	if m.frames != nil {
		_ = m.frames.Close()
	}
	_ = m.conn.Close()
	m.conn, m.frames, m.cc, m.rpc = nil, nil, nil, nil
}

func (m *masterConn) close() {
	m.mu.Lock()
	m.closed = true
	if m.conn != nil {
		m.closeConn()
	}
	m.mu.Unlock()
	if m.etcd != nil {
		_ = m.etcd.Close()
	}
}

// call runs f against the leader, retrying with backoff while no master
// serves (a failover in progress), within the RPC timeout. Every master
// RPC is safe to repeat: the master answers a repeated PutStart or PutEnd
// of the same client as the first.
func (m *masterConn) call(ctx context.Context, f func(ctx context.Context, rpc storepb.MasterClient) error) error {
	// The call's own deadline, the RPC timeout, passing without an answer
	// puts the connection in doubt; a caller's earlier one does not.
	parent, bounded := ctx.Deadline()
	ownDeadline := !bounded || !parent.Before(time.Now().Add(m.timeout))
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	for {
		rpc, gen, err := m.current(ctx)
		if err == nil {
			err = f(ctx, rpc)
			if err == nil || !m.retryable(ctx, err) {
				if m.etcd != nil && (errors.Is(err, errNoAnswer) || ownDeadline && status.Code(err) == codes.DeadlineExceeded) {
					m.drop(gen) // the leader may have moved: look it up next time
				}
				return rpcErr(ctx, err)
			}
			if m.etcd != nil {
				m.drop(gen)
			}
		}
		select {
		case <-ctx.Done():
			return rpcErr(ctx, fmt.Errorf("%w (last: %v)", ctx.Err(), err))
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// retryable tells whether a failed call may go to the leader again: no
// master served it (codes.Unavailable), or another call dropped the
// connection under it (codes.Canceled while the call's own context
// lives: gRPC's "the client connection is closing").
func (m *masterConn) retryable(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		return m.etcd != nil && ctx.Err() == nil
	}
	return false
}

// rpcErr maps transport failures to the store's codes, keeping the failure
// as the cause, and a request the master refused as too large to
// INVALID_PARAMS; store errors pass. gRPC reports a call its context ended
// as a status, which is not the context's error: that is added to the
// chain, so that callers can test errors.Is(err, context.Canceled).
func rpcErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var se *storepb.Error
	if errors.As(err, &se) {
		return err
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted:
		// The master refused the request as it is (a batch or a message
		// over its limits): the caller's to fix, not an RPC to retry.
		return &storepb.Error{Code: storepb.InvalidParams, Msg: status.Convert(err).Message()}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		return &storepb.Error{Code: storepb.RPCTimeout, Err: err}
	}
	return &storepb.Error{Code: storepb.RPCFail, Err: err}
}

// errBatchSize is the error of a batch answer with the wrong number of
// items, which a sound master never sends.
var errBatchSize = &storepb.Error{Code: storepb.RPCFail, Msg: "master answered a batch of another size"}

// batchErr is the error a batch call leaves every item with: the call's
// own, or errBatchSize when the answer has got items instead of want.
func batchErr(err error, got, want int) error {
	if err == nil && got != want {
		return errBatchSize
	}
	return err
}

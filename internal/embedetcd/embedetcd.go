// Package embedetcd runs a one-member etcd inside the process: the
// all-in-one `mooncake up` uses it so a fresh machine needs no etcd, and
// tests use it (through internal/etcdtest) instead of a fake.
package embedetcd

import (
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
)

// Etcd is a running embedded etcd.
type Etcd struct {
	e *embed.Etcd
}

// Option adjusts the embedded etcd.
type Option func(*embed.Config)

// NoFsync makes etcd skip fsync. The all-in-one store uses it: its etcd
// holds the master's journal, which guards against a master process dying;
// the same machine's crash takes every DRAM replica with it, so syncing the
// journal to disk would buy nothing and costs milliseconds per put.
func NoFsync() Option { return func(c *embed.Config) { c.UnsafeNoFsync = true } }

// ClientTLS makes etcd serve its clients over TLS with the certificate and
// key files, and, with a clientCA file, require client certificates that
// CA signed (etcd's --client-cert-auth).
func ClientTLS(cert, key, clientCA string) Option {
	return func(c *embed.Config) {
		c.ClientTLSInfo.CertFile, c.ClientTLSInfo.KeyFile = cert, key
		if clientCA != "" {
			c.ClientTLSInfo.TrustedCAFile, c.ClientTLSInfo.ClientCertAuth = clientCA, true
		}
	}
}

// Start runs etcd with its data in dir, serving clients on clientAddr
// ("127.0.0.1:0" picks a free port). It returns once etcd is ready.
func Start(dir, clientAddr string, opts ...Option) (*Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	for _, o := range opts {
		o(cfg)
	}
	// Its shutdown logs errors about closed listeners; failures that matter
	// come through Err().
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	scheme := "http"
	if !cfg.ClientTLSInfo.Empty() {
		scheme = "https"
	}
	cu, err := url.Parse(scheme + "://" + clientAddr)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client address %q: %w", clientAddr, err)
	}
	// The peer port is never dialled by a single member; port 0 keeps
	// several embedded etcds on one machine apart.
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedetcd: %w", err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("embedetcd: not ready after a minute")
	}
	if len(e.Clients) == 0 {
		e.Close()
		return nil, fmt.Errorf("embedetcd: no client listener")
	}
	return &Etcd{e: e}, nil
}

// Addr is the client address, "host:port".
func (x *Etcd) Addr() string { return x.e.Clients[0].Addr().String() }

// Client is a client of this etcd that calls the server in process, with
// no gRPC or socket between: a master in the same process waits for each
// journal write on etcd itself, not on the loopback round trip. The caller
// closes it (before Close).
func (x *Etcd) Client() *clientv3.Client { return v3client.New(x.e.Server) }

// Close stops etcd.
func (x *Etcd) Close() { x.e.Close() }

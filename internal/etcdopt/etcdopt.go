// Package etcdopt holds the etcd client settings that every etcd client of
// mooncake-go shares (masters, store clients, the engine's metadata, the
// P2P store).
package etcdopt

import (
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/mooncake-go/mooncake/internal/secure"
)

// Keep-alive of the client's connection: while an RPC or a stream is open
// (a campaign's grant, a watch, a lease renewal), gRPC pings the member
// every KeepAliveTime and drops the connection when no answer comes within
// KeepAliveTimeout, then dials again. Without it a connection cut off
// silently (a partition, not a closed socket) stays open until TCP gives
// up, many minutes later: after etcd came back from a 30 s outage, the
// masters' campaigns and watches waited on the dead connection's TCP
// retransmission backoff and no master led for over 30 s
// (internal/faults TestEtcdUnavailable). 10 s is the least gRPC allows;
// idle connections are not pinged, as etcd refuses that by default.
const (
	KeepAliveTime    = 10 * time.Second
	KeepAliveTimeout = 3 * time.Second
)

// Config is a client configuration for endpoints with the shared settings
// and no logging (failures reach callers as errors).
func Config(endpoints []string, dialTimeout time.Duration) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    KeepAliveTime,
		DialKeepAliveTimeout: KeepAliveTimeout,
		Logger:               zap.NewNop(),
	}
}

// ConfigTLS is Config dialing etcd over t (a client CA, and a client
// certificate where etcd's --client-cert-auth asks for one); a zero t is
// Config.
func ConfigTLS(endpoints []string, dialTimeout time.Duration, t secure.TLS) (clientv3.Config, error) {
	cfg := Config(endpoints, dialTimeout)
	tc, err := t.Client()
	if err != nil {
		return cfg, fmt.Errorf("etcd TLS: %w", err)
	}
	cfg.TLS = tc
	if tc != nil && t.ServerName != "" {
		// The etcd client names each address's TLS server after the
		// endpoint's host, over the config's ServerName: only the
		// channel's authority goes before that.
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithAuthority(t.ServerName))
	}
	return cfg, nil
}

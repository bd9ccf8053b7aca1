package metadata

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/mooncake-go/mooncake/internal/etcdopt"
)

const (
	// etcdDialTimeout bounds OpenEtcd's first contact with the cluster.
	etcdDialTimeout = 5 * time.Second
	// etcdOpTimeout bounds an operation whose ctx carries no deadline: the
	// etcd client retries an unreachable cluster until its ctx ends, and a
	// metadata lookup must not hang an engine forever.
	etcdOpTimeout = 5 * time.Second
)

// Etcd is a Store kept in an etcd cluster, the default backend of Mooncake.
// Keys and values are stored as they are, so official engines pointed at the
// same cluster see our descriptors and we see theirs.
type Etcd struct {
	cli       *clientv3.Client
	closeOnce sync.Once
	closeErr  error
}

var _ Store = (*Etcd)(nil)

// EtcdEndpoints splits Mooncake's etcd connection string, "h1:2379",
// "etcd://h1:2379;h2:2379" or comma-separated, into "host:port" endpoints.
func EtcdEndpoints(conn string) []string {
	var eps []string
	for _, ep := range strings.FieldsFunc(strings.TrimPrefix(strings.TrimSpace(conn), "etcd://"),
		func(r rune) bool { return r == ',' || r == ';' }) {
		// Each endpoint may carry the scheme too ("etcd://a;etcd://b").
		if ep = strings.TrimPrefix(strings.TrimSpace(ep), "etcd://"); ep != "" {
			eps = append(eps, ep)
		}
	}
	return eps
}

// OpenEtcd connects to the etcd cluster at endpoints, each "host:port" or
// "http://host:port". It fails if no endpoint answers within 5 s, so a
// wrong connection string is reported at start-up rather than at the first
// transfer.
func OpenEtcd(endpoints []string, opts ...OpenOption) (*Etcd, error) {
	var eps []string
	for _, ep := range endpoints {
		// "etcd://" is Mooncake's scheme, not a URL gRPC understands.
		ep = strings.TrimPrefix(strings.TrimSpace(ep), "etcd://")
		if ep != "" {
			eps = append(eps, ep)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("metadata: etcd: no endpoints")
	}
	// The client logs a warning per retry; our errors already say what
	// failed, so only its errors are worth a log line.
	logCfg := logutil.DefaultZapLoggerConfig
	logCfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	ecfg, err := etcdopt.ConfigTLS(eps, etcdDialTimeout, openOptions(opts).tls)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	ecfg.Logger, ecfg.LogConfig = nil, &logCfg
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("metadata: etcd %v: %w", eps, err)
	}

	// The client dials lazily; one cheap read proves the cluster is there.
	// Serializable: any member may answer, no quorum round needed.
	ctx, cancel := context.WithTimeout(context.Background(), etcdDialTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, KeyPrefix(), clientv3.WithSerializable(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("metadata: etcd %v unreachable: %w", eps, err)
	}
	return &Etcd{cli: cli}, nil
}

// errEtcdClosed: an operation after Close. The etcd client would retry it
// until the deadline; we fail at once.
var errEtcdClosed = errors.New("metadata: etcd: store closed")

// opContext bounds ctx by etcdOpTimeout unless it already has a deadline,
// and fails if the store is closed.
func (s *Etcd) opContext(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.cli.Ctx().Err() != nil {
		return nil, nil, errEtcdClosed
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	return ctx, cancel, nil
}

// Get returns the value of key, or an error wrapping ErrNotFound.
func (s *Etcd) Get(ctx context.Context, key string) ([]byte, error) {
	ctx, cancel, err := s.opContext(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("metadata: etcd get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return resp.Kvs[0].Value, nil
}

// Put sets key to value.
func (s *Etcd) Put(ctx context.Context, key string, value []byte) error {
	ctx, cancel, err := s.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := s.cli.Put(ctx, key, string(value)); err != nil {
		return fmt.Errorf("metadata: etcd put %s: %w", key, err)
	}
	return nil
}

// Delete removes key; an absent key is not an error.
func (s *Etcd) Delete(ctx context.Context, key string) error {
	ctx, cancel, err := s.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := s.cli.Delete(ctx, key); err != nil {
		return fmt.Errorf("metadata: etcd delete %s: %w", key, err)
	}
	return nil
}

// Close releases the connection; operations after Close fail. Calling it
// again returns the first call's result.
func (s *Etcd) Close() error {
	s.closeOnce.Do(func() {
		if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			s.closeErr = fmt.Errorf("metadata: etcd close: %w", err)
		}
	})
	return s.closeErr
}

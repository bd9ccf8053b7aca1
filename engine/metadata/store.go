package metadata

import (
	"context"
	"errors"
	"fmt"
	"github.com/mooncake-go/mooncake/internal/secure"
	"strings"
	"sync"
)

// ErrNotFound: the key has no value.
var ErrNotFound = errors.New("metadata: key not found")

// P2PHandshake is the connection string of the serverless mode: segment
// descriptors are exchanged over the handshake socket instead of a store.
const P2PHandshake = "P2PHANDSHAKE"

// Store is a key-value store for segment descriptors and rpc_meta records.
// Values are JSON text, as in every Mooncake backend. Get of an absent key
// returns an error wrapping ErrNotFound; Delete of an absent key is not an
// error.
type Store interface {
	Get(ctx context.Context, key string) ([]byte, error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	Close() error
}

// Open returns the store a Mooncake connection string names:
//
//	P2PHANDSHAKE (or "")         nil: no store, descriptors travel by handshake
//	etcd://h1:p1,h2:p2 or h:p     etcd (scheme-less strings are etcd, as Mooncake)
//	http://h:p/metadata           HTTP (GET/PUT/DELETE ?key=)
//	memory://name                 process-wide in-memory store, for tests
//
// opts carry credentials: a bearer token (HTTP) and TLS (HTTP, etcd).
func Open(conn string, opts ...OpenOption) (Store, error) {
	if conn == "" || conn == P2PHandshake {
		return nil, nil
	}
	scheme, rest, ok := strings.Cut(conn, "://")
	if !ok {
		scheme, rest = "etcd", conn
	}
	switch scheme {
	case "etcd":
		return OpenEtcd(EtcdEndpoints(rest), opts...)
	case "http", "https":
		return OpenHTTP(conn, opts...)
	case "memory":
		return OpenMemory(rest), nil
	}
	return nil, fmt.Errorf("metadata: unsupported connection string %q (want P2PHANDSHAKE, etcd://, http://, memory://)", conn)
}

// OpenOption carries a credential to Open, OpenHTTP or OpenEtcd.
type OpenOption func(*openOpts)

type openOpts struct {
	token string
	tls   secure.TLS
}

// WithToken presents "Authorization: Bearer " + token on every HTTP
// request (Server's ServerToken); etcd ignores it. Empty: none.
func WithToken(token string) OpenOption { return func(o *openOpts) { o.token = token } }

// WithTLS dials the HTTP server (an https URL) or etcd over TLS: its
// CAFile verifies the server, and its certificate is presented where the
// server requires one. Zero: plaintext.
func WithTLS(t secure.TLS) OpenOption { return func(o *openOpts) { o.tls = t } }

func openOptions(opts []OpenOption) openOpts {
	var o openOpts
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Memory is an in-process Store. Stores opened with the same name share
// their contents, so several engines in one test can meet through it.
type Memory struct {
	m *memData
}

type memData struct {
	mu sync.RWMutex
	kv map[string][]byte
}

var (
	memMu    sync.Mutex
	memNamed = map[string]*memData{}
)

var _ Store = (*Memory)(nil)

// OpenMemory returns the in-memory store called name.
func OpenMemory(name string) *Memory {
	memMu.Lock()
	defer memMu.Unlock()
	d := memNamed[name]
	if d == nil {
		d = &memData{kv: map[string][]byte{}}
		memNamed[name] = d
	}
	return &Memory{m: d}
}

func (s *Memory) Get(_ context.Context, key string) ([]byte, error) {
	s.m.mu.RLock()
	defer s.m.mu.RUnlock()
	v, ok := s.m.kv[key]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return append([]byte(nil), v...), nil
}

func (s *Memory) Put(_ context.Context, key string, value []byte) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.kv[key] = append([]byte(nil), value...)
	return nil
}

func (s *Memory) Delete(_ context.Context, key string) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	delete(s.m.kv, key)
	return nil
}

func (s *Memory) Close() error { return nil }

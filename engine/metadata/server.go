package metadata

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport/conn"
	"github.com/mooncake-go/mooncake/internal/secure"
)

// Server is an in-memory HTTP metadata server speaking Mooncake's protocol,
// so that our engines, the official ones and HTTP clients can share it:
//
//	GET    /metadata?key=K   200 and the value verbatim; 404 when absent
//	PUT    /metadata?key=K   stores the body (at most MaxValueSize, else 413)
//	DELETE /metadata?key=K   200; 404 when absent
//	GET    /metadata/keys    the keys as a sorted JSON array (?prefix= filters)
//	GET    /health           {"status":"ok"}
//
// A request without a key gets 400. Like Mooncake's embedded server, a PUT
// of an rpc_meta key (".../rpc_meta/<name>") that already holds a different
// value gets 400: two engines claiming one name must not silently replace
// each other's address. Re-putting the same value gets 200.
//
// Server is an http.Handler; Serve runs it on a listener, or mount it in
// any http.Server. Contents live only as long as the Server.
//
// It is open by default, as Mooncake's. ServerToken requires a bearer
// token on every request, /health included (401 without it: Mooncake's
// engines present none, and cannot use a server that asks); ServerTLS makes
// Serve speak TLS, mutual where the configuration requires client
// certificates.
type Server struct {
	mux *http.ServeMux
	h   http.Handler // mux, behind the token check when there is one
	tls *tls.Config  // nil: plaintext

	mu sync.RWMutex
	// kv values are never modified after they are stored (a PUT stores a
	// fresh slice), so a handler may write one out after unlocking.
	kv map[string][]byte
}

var _ http.Handler = (*Server)(nil)

// ServerOption configures a Server.
type ServerOption func(*Server, *serverOptions)

type serverOptions struct{ token string }

// ServerToken makes every request carry "Authorization: Bearer " + token;
// others get 401. An empty token: none.
func ServerToken(token string) ServerOption {
	return func(_ *Server, o *serverOptions) { o.token = token }
}

// ServerTLS makes Serve speak TLS with cfg (see secure.TLS.Server); nil:
// plaintext.
func ServerTLS(cfg *tls.Config) ServerOption {
	return func(s *Server, _ *serverOptions) { s.tls = cfg }
}

// NewServer returns an empty metadata server.
func NewServer(opts ...ServerOption) *Server {
	s := &Server{mux: http.NewServeMux(), kv: map[string][]byte{}}
	var o serverOptions
	for _, opt := range opts {
		opt(s, &o)
	}
	s.mux.HandleFunc("GET /metadata", s.get)
	s.mux.HandleFunc("PUT /metadata", s.put)
	s.mux.HandleFunc("DELETE /metadata", s.delete)
	s.mux.HandleFunc("GET /metadata/keys", s.keys)
	s.mux.HandleFunc("GET /health", s.health)
	s.h = secure.RequireHTTP(o.token, nil, s.mux)
	return s
}

// ServeHTTP routes a request; unknown paths get 404, wrong methods 405.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.h.ServeHTTP(w, r) }

// shutdownGrace is how long Serve lets requests in flight finish.
const shutdownGrace = 5 * time.Second

// Connection limits of Serve: a connection over one is closed as it is
// accepted, and the refusal logged, so that no client can hold every file
// descriptor (ours keep a few alive per engine; Mooncake's curl opens one
// per request).
const (
	ServerMaxConns        = 4096
	ServerMaxConnsPerPeer = 256
)

// Serve answers requests on ln, within ServerMaxConns and
// ServerMaxConnsPerPeer connections, until ctx is done, then stops
// accepting, lets requests in flight finish (up to 5 s) and returns nil.
// It closes ln. Any other failure of the listener is returned at once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler: s,
		// Slow or stuck clients must not pin connections forever.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	errc := make(chan error, 1)
	var lim net.Listener = conn.Limit(ln, conn.Limits{Total: ServerMaxConns, PerPeer: ServerMaxConnsPerPeer}, slog.Default())
	if s.tls != nil {
		lim = tls.NewListener(lim, s.tls)
	}
	go func() { errc <- hs.Serve(lim) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		err = errors.Join(err, hs.Close()) // grace ran out: drop the rest
	}
	<-errc // http.ErrServerClosed, now that Shutdown has run
	return err
}

// queryKey returns the request's key, or answers 400 and returns "".
func queryKey(w http.ResponseWriter, r *http.Request) string {
	k := r.URL.Query().Get("key")
	if k == "" {
		http.Error(w, "missing key", http.StatusBadRequest)
	}
	return k
}

// isRPCMeta reports whether k is an rpc_meta record, under any prefix.
func isRPCMeta(k string) bool {
	return strings.HasPrefix(k, "rpc_meta/") || strings.Contains(k, "/rpc_meta/")
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	k := queryKey(w, r)
	if k == "" {
		return
	}
	s.mu.RLock()
	v, ok := s.kv[k]
	s.mu.RUnlock()
	if !ok {
		http.Error(w, "metadata not found", http.StatusNotFound)
		return
	}
	// Values are JSON in every Mooncake client; we hand them back untouched.
	w.Header().Set("Content-Type", "application/json")
	w.Write(v)
}

func (s *Server) put(w http.ResponseWriter, r *http.Request) {
	k := queryKey(w, r)
	if k == "" {
		return
	}
	tooLarge := fmt.Sprintf("metadata value over the limit of %d bytes", MaxValueSize)
	if r.ContentLength > MaxValueSize {
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return
	}
	v, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxValueSize))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	old, exists := s.kv[k]
	switch {
	case exists && isRPCMeta(k) && !bytes.Equal(old, v):
		s.mu.Unlock()
		http.Error(w, "rpc_meta already registered with a different value", http.StatusBadRequest)
		return
	case exists && isRPCMeta(k):
		s.mu.Unlock()
		io.WriteString(w, "metadata unchanged")
		return
	}
	s.kv[k] = v
	s.mu.Unlock()
	io.WriteString(w, "metadata updated")
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	k := queryKey(w, r)
	if k == "" {
		return
	}
	s.mu.Lock()
	_, ok := s.kv[k]
	delete(s.kv, k)
	s.mu.Unlock()
	if !ok {
		http.Error(w, "metadata not found", http.StatusNotFound)
		return
	}
	io.WriteString(w, "metadata deleted")
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	s.mu.RLock()
	ks := make([]string, 0, len(s.kv))
	for k := range s.kv {
		if strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	s.mu.RUnlock()
	slices.Sort(ks)
	writeJSON(w, ks)
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]string{"status": "ok"})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

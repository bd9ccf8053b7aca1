package master

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/storepb"
)

const testToken = "test-token-1234"

// callAll makes a unary call (Ping), a mutating one (RemoveAll) and a
// stream's first answer (WatchObjects) on conn, and returns their errors.
func callAll(ctx context.Context, conn *grpc.ClientConn) []error {
	c := storepb.NewMasterClient(conn)
	_, ping := c.Ping(ctx, &storepb.PingRequest{ClientId: "c1"})
	_, remove := c.RemoveAll(ctx, &storepb.RemoveAllRequest{Force: true})
	var watch error
	if st, err := c.WatchObjects(ctx, &storepb.WatchObjectsRequest{}); err != nil {
		watch = err
	} else {
		_, watch = st.Recv()
	}
	return []error{ping, remove, watch}
}

func dialWith(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func tlsCreds(t *testing.T, s secure.TLS) grpc.DialOption {
	t.Helper()
	tc, err := s.Client()
	require.NoError(t, err)
	return grpc.WithTransportCredentials(credentials.NewTLS(tc))
}

// TestAuthGRPC: a master with a token (and with mutual TLS) refuses every
// call, unary and stream, of a client without the credentials, and serves
// one with them.
func TestAuthGRPC(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	token := grpc.WithPerRPCCredentials(secure.PerRPC(testToken))
	noCert := files.ClientTLS()
	noCert.CertFile, noCert.KeyFile = "", ""

	type client struct {
		name string
		opts []grpc.DialOption
		want codes.Code // codes.OK: served
		msg  string     // in the error's message
	}
	tests := []struct {
		name    string
		tls     secure.TLS
		clients []client
	}{
		{"token", secure.TLS{}, []client{
			// No token: refused, saying what is missing.
			{"none", []grpc.DialOption{plain}, codes.Unauthenticated, "missing bearer token"},
			// Another token: refused.
			{"wrong", []grpc.DialOption{plain, grpc.WithPerRPCCredentials(secure.PerRPC("other"))}, codes.Unauthenticated, "wrong bearer token"},
			{"right", []grpc.DialOption{plain, token}, codes.OK, ""},
		}},
		{"mutual TLS", files.ServerTLS(), []client{
			// Plaintext to a TLS server: no connection.
			{"plaintext", []grpc.DialOption{plain, token}, codes.Unavailable, ""},
			// TLS without a client certificate: the handshake is refused
			// (the client reads the server's alert or the reset after it).
			{"no client cert", []grpc.DialOption{tlsCreds(t, noCert), token}, codes.Unavailable, ""},
			// The certificate but no token: refused still.
			{"no token", []grpc.DialOption{tlsCreds(t, files.ClientTLS())}, codes.Unauthenticated, "missing bearer token"},
			{"right", []grpc.DialOption{tlsCreds(t, files.ClientTLS()), token}, codes.OK, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Start(ServerConfig{Listen: "127.0.0.1:0", Token: testToken, TLS: tt.tls})
			require.NoError(t, err)
			t.Cleanup(func() { _ = m.Close() })
			for _, c := range tt.clients {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					for i, err := range callAll(ctx, dialWith(t, m.Addr(), c.opts...)) {
						call := []string{"Ping", "RemoveAll", "WatchObjects"}[i]
						assert.Equal(t, c.want, status.Code(err), "%s: %v", call, err)
						assert.Contains(t, status.Convert(err).Message(), c.msg, call)
					}
				})
			}
		})
	}
}

// TestAuthAdmin: the admin server requires the token on every endpoint;
// with OpenProbes /health, /readyz and /metrics answer without it, and the rest
// still require it; with mutual TLS a client without a certificate gets
// no answer.
func TestAuthAdmin(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	get := func(t *testing.T, c *http.Client, url, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	paths := []string{"/health", "/metrics", "/readyz", "/role", "/leader", "/get_all_segments", "/get_all_keys", "/query_key?key=k", "/kv_events/status"}
	probe := func(p string) bool { return p == "/health" || p == "/metrics" || p == "/readyz" }

	tests := []struct {
		name       string
		openProbes bool
	}{
		// Every endpoint requires the token.
		{"closed", false},
		// Probes answer without it; the rest require it.
		{"open probes", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Start(ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Token: testToken, OpenProbes: tt.openProbes})
			require.NoError(t, err)
			t.Cleanup(func() { _ = m.Close() })
			base := "http://" + m.AdminAddr()
			for _, p := range paths {
				code, body := get(t, http.DefaultClient, base+p, "")
				if tt.openProbes && probe(p) {
					assert.Equal(t, http.StatusOK, code, "%s without a token: %s", p, body)
				} else {
					assert.Equal(t, http.StatusUnauthorized, code, "%s without a token: %s", p, body)
					assert.Contains(t, body, "missing bearer token", p)
				}
				code, body = get(t, http.DefaultClient, base+p, "wrong")
				if !(tt.openProbes && probe(p)) {
					assert.Equal(t, http.StatusUnauthorized, code, "%s with a wrong token: %s", p, body)
					assert.Contains(t, body, "wrong bearer token", p)
				}
				code, body = get(t, http.DefaultClient, base+p, testToken)
				assert.NotEqual(t, http.StatusUnauthorized, code, "%s with the token: %s", p, body)
			}
		})
	}

	t.Run("mutual TLS", func(t *testing.T) {
		m, err := Start(ServerConfig{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Token: testToken, TLS: files.ServerTLS()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		url := "https://" + m.AdminAddr() + "/get_all_keys"
		client := func(s secure.TLS) *http.Client {
			tc, err := s.Client()
			require.NoError(t, err)
			return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		}
		noCert := files.ClientTLS()
		noCert.CertFile, noCert.KeyFile = "", ""
		_, err = client(noCert).Get(url)
		require.Error(t, err, "a client without a certificate was answered")
		// The server's alert, or the reset after it, whichever the client reads first.
		assert.Regexp(t, "certificate required|connection reset|broken pipe|EOF", err.Error())
		// Plaintext to the TLS port: net/http answers 400, nothing else.
		code, _ := get(t, http.DefaultClient, strings.Replace(url, "https", "http", 1), testToken)
		assert.Equal(t, http.StatusBadRequest, code, "plaintext to the TLS admin server")
		code, _ = get(t, client(files.ClientTLS()), url, "")
		assert.Equal(t, http.StatusUnauthorized, code, "certificate without the token")
		code, body := get(t, client(files.ClientTLS()), url, testToken)
		assert.Equal(t, http.StatusOK, code, body)
	})
}

// TestAuthConfig: bad TLS files fail Start, naming the field.
func TestAuthConfig(t *testing.T) {
	_, err := Start(ServerConfig{Listen: "127.0.0.1:0", TLS: secure.TLS{CertFile: "/nonexistent.pem", KeyFile: "/nonexistent-key.pem"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ServerConfig.TLS")
	_, err = Start(ServerConfig{Listen: "127.0.0.1:0", TLS: secure.TLS{CertFile: "/x.pem"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "key file")
}

// TestAuthEtcdTLS: an HA master dials an etcd that requires client
// certificates with HAConfig.EtcdTLS, and leads.
func TestAuthEtcdTLS(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync(),
		embedetcd.ClientTLS(files.ServerCert, files.ServerKey, files.CA))
	require.NoError(t, err)
	t.Cleanup(e.Close)
	m, err := Start(ServerConfig{Listen: "127.0.0.1:0",
		HA: &HAConfig{Etcd: []string{e.Addr()}, EtcdTLS: files.ClientTLS()}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	require.Eventually(t, m.Leading, 20*time.Second, 10*time.Millisecond, "the master never led")

	_, err = Start(ServerConfig{Listen: "127.0.0.1:0",
		HA: &HAConfig{Etcd: []string{e.Addr()}, EtcdTLS: secure.TLS{CAFile: "/nonexistent.pem"}}})
	assert.ErrorContains(t, err, "etcd TLS")
}

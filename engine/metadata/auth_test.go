package metadata

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/secure"
)

// serveAuth serves a Server built with opts on loopback until the test
// ends, and returns its /metadata URL.
func serveAuth(t *testing.T, scheme string, opts ...ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(opts...).Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return scheme + "://" + ln.Addr().String() + "/metadata"
}

// TestServerAuth: a metadata server with a token (and with mutual TLS)
// refuses every request of a client without the credentials, saying why,
// and serves one with them.
func TestServerAuth(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	const token = "metadata-token"
	srvTLS, err := files.ServerTLS().Server()
	require.NoError(t, err)
	noCert := files.ClientTLS()
	noCert.CertFile, noCert.KeyFile = "", ""

	type client struct {
		name string
		opts []OpenOption
		want string // matches every call's error; "": served
	}
	tests := []struct {
		name    string
		scheme  string
		opts    []ServerOption
		clients []client
	}{
		{"token", "http", []ServerOption{ServerToken(token)}, []client{
			{"none", nil, "401 Unauthorized: \"missing bearer token"},
			{"wrong", []OpenOption{WithToken("other")}, "401 Unauthorized: \"wrong bearer token"},
			{"right", []OpenOption{WithToken(token)}, ""},
		}},
		{"mutual TLS", "https", []ServerOption{ServerToken(token), ServerTLS(srvTLS)}, []client{
			// No client certificate: the handshake is refused (the
			// client reads the server's alert, or the reset after it).
			{"no client cert", []OpenOption{WithToken(token), WithTLS(noCert)}, "certificate required|connection reset|broken pipe|EOF"},
			// The certificate without the token.
			{"no token", []OpenOption{WithTLS(files.ClientTLS())}, "401 Unauthorized"},
			{"right", []OpenOption{WithToken(token), WithTLS(files.ClientTLS())}, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := serveAuth(t, tt.scheme, tt.opts...)
			for _, c := range tt.clients {
				t.Run(c.name, func(t *testing.T) {
					h, err := OpenHTTP(url, c.opts...)
					require.NoError(t, err)
					defer h.Close()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					errs := []error{h.Put(ctx, "k", []byte(`{"v":1}`))}
					_, gerr := h.Get(ctx, "k")
					errs = append(errs, gerr, h.Delete(ctx, "k"))
					for i, err := range errs {
						call := []string{"PUT", "GET", "DELETE"}[i]
						if c.want == "" {
							assert.NoError(t, err, call)
						} else if assert.Error(t, err, call) {
							assert.Regexp(t, c.want, err.Error(), call)
						}
					}
				})
			}
		})
	}
	t.Run("health", func(t *testing.T) {
		// /health too: nothing answers without the token.
		url := serveAuth(t, "http", ServerToken(token))
		resp, err := http.Get(url[:len(url)-len("/metadata")] + "/health")
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	})
	t.Run("TLS for plain http", func(t *testing.T) {
		_, err := OpenHTTP("http://127.0.0.1:1/metadata", WithTLS(files.ClientTLS()))
		assert.ErrorContains(t, err, "use https://")
	})
}

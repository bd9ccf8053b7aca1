package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/master"
)

// TestAuth: against a master with a token and mutual TLS, a client
// without the credentials fails at New with an error that says why, and
// one with them (Config.MasterTLS, Config.Token) stores and reads.
func TestAuth(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	const token = "client-test-token"
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Token: token, TLS: files.ServerTLS()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	noCert := files.ClientTLS()
	noCert.CertFile, noCert.KeyFile = "", ""

	tests := []struct {
		name  string
		tls   secure.TLS
		token string
		want  string // in New's error; "": New succeeds
	}{
		// Plaintext to the TLS master: no connection within the timeout.
		{"plaintext", secure.TLS{}, token, "deadline exceeded"},
		// TLS without a client certificate: the handshake is refused.
		{"no client cert", noCert, token, "deadline exceeded"},
		// The certificate without the token, or with another.
		{"no token", files.ClientTLS(), "", "missing bearer token"},
		{"wrong token", files.ClientTLS(), "other", "wrong bearer token"},
		{"both", files.ClientTLS(), token, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{
				Master: m.Addr(), SegmentSize: 1 << 20, LocalBufferSize: 1 << 20,
				EngineConfig: engine.Config{Host: "127.0.0.1"},
				MasterTLS:    tt.tls, Token: tt.token, RPCTimeout: 2 * time.Second,
			}
			c, err := New(context.Background(), cfg)
			if tt.want != "" {
				require.Error(t, err, "a client without its credentials was served")
				assert.Contains(t, err.Error(), tt.want)
				return
			}
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			ctx := ctxT(t)
			v := value(1, 4096)
			require.NoError(t, c.Put(ctx, "k", v, nil))
			got, err := c.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, v, got)
		})
	}
}

package etcdopt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/secure"
)

// TestConfigTLS: against an etcd that requires TLS client certificates, a
// client configured with ConfigTLS reads and writes; one without a
// certificate, or without TLS, does not.
func TestConfigTLS(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync(),
		embedetcd.ClientTLS(files.ServerCert, files.ServerKey, files.CA))
	require.NoError(t, err)
	t.Cleanup(e.Close)
	noCert := files.ClientTLS()
	noCert.CertFile, noCert.KeyFile = "", ""

	tests := []struct {
		name string
		tls  secure.TLS
		ok   bool
	}{
		{"plaintext", secure.TLS{}, false},
		{"no client cert", noCert, false},
		{"mutual", files.ClientTLS(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigTLS([]string{e.Addr()}, 2*time.Second, tt.tls)
			require.NoError(t, err)
			cli, err := clientv3.New(cfg)
			require.NoError(t, err)
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err = cli.Put(ctx, "k", "v")
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err, "etcd served a client without its credentials")
			}
		})
	}
	_, err = ConfigTLS([]string{e.Addr()}, time.Second, secure.TLS{CAFile: "/nonexistent.pem"})
	assert.ErrorContains(t, err, "etcd TLS")
}

// TestConfigTLSServerName: an etcd whose certificate names no address the
// client dials is verified for TLS.ServerName, and refused without it.
func TestConfigTLSServerName(t *testing.T) {
	files, err := secure.GenerateFor(t.TempDir(), "etcd.mooncake.test")
	require.NoError(t, err)
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync(),
		embedetcd.ClientTLS(files.ServerCert, files.ServerKey, files.CA))
	require.NoError(t, err)
	t.Cleanup(e.Close)
	named := files.ClientTLS()
	named.ServerName = "etcd.mooncake.test"
	other := named
	other.ServerName = "other.mooncake.test"
	for _, tt := range []struct {
		name string
		tls  secure.TLS
		ok   bool
	}{{"the address", files.ClientTLS(), false}, {"the name", named, true}, {"another name", other, false}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigTLS([]string{e.Addr()}, 2*time.Second, tt.tls)
			require.NoError(t, err)
			cli, err := clientv3.New(cfg)
			require.NoError(t, err)
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err = cli.Put(ctx, "k", "v")
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err, "etcd's certificate verified for a name it does not carry")
			}
		})
	}
}

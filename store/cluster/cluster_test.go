package cluster

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Start that finds one of its addresses held by a listening socket
// returns an *AddrInUseError naming it (errors.Is EADDRINUSE), after
// stopping what it had started: the etcd directory it made is removed.
func TestStartAddrInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	addr := held.Addr().String()
	cases := []struct {
		name string
		cfg  Config
		what string
	}{
		{"etcd client", Config{Etcd: addr}, "etcd client"},
		{"master rpc, etcd running", Config{MasterListen: addr}, "master rpc"},
		{"master admin, etcd running", Config{Admin: addr}, "master metrics"},
		{"master rpc without HA", Config{NoHA: true, MasterListen: addr}, "master rpc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			tc.cfg.Nodes = NoNodes
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Start(ctx, tc.cfg)
			require.Nil(t, c)
			var inUse *AddrInUseError
			require.True(t, errors.As(err, &inUse), "%v", err)
			assert.Equal(t, &AddrInUseError{What: tc.what, Addr: addr}, inUse)
			assert.ErrorIs(t, err, syscall.EADDRINUSE)
			assert.Equal(t, tc.what+" address "+addr+" in use", err.Error())
			left, err := os.ReadDir(tmp)
			require.NoError(t, err)
			assert.Empty(t, left)
		})
	}
}

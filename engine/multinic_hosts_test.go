package engine_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// TestExtraHostsDuplicates: an address listed twice (in ExtraHosts or
// MC_TCP_BIND_ADDRESSES) is one NIC: it should be served and published
// once, not given a second listener on another port and a double share
// of the lanes.
func TestExtraHostsDuplicates(t *testing.T) {
	t.Run("config", func(t *testing.T) {
		e := newEngine(t, engine.Config{Metadata: "memory://" + t.Name(), Transport: "tcp",
			Host: "127.0.0.3", ExtraHosts: []string{"127.0.0.4", "127.0.0.4"}})
		require.Equal(t, []string{net.JoinHostPort("127.0.0.4", strconv.Itoa(e.DataPort()))},
			published(t, e).TCPDataAddrs)
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("MC_TCP_BIND_ADDRESS", "")
		t.Setenv("MC_TCP_BIND_ADDRESSES", "127.0.0.3,127.0.0.4,127.0.0.4")
		e, err := engine.New(t.Context(), engine.Config{Metadata: "memory://" + t.Name(), Transport: "tcp"})
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() })
		require.Equal(t, []string{net.JoinHostPort("127.0.0.4", strconv.Itoa(e.DataPort()))},
			published(t, e).TCPDataAddrs)
	})
}

// TestExtraHostsSameAsHostOtherSpelling: ExtraHosts naming Host's own
// address in another spelling (IPv6 has several) is Host, not a second NIC.
func TestExtraHostsSameAsHostOtherSpelling(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	ln.Close()
	e := newEngine(t, engine.Config{Metadata: "memory://" + t.Name(), Transport: "tcp",
		Host: "::1", ExtraHosts: []string{"0:0::1"}})
	require.Empty(t, published(t, e).TCPDataAddrs)
}

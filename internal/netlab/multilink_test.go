package netlab_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
)

// A host's second link carries the traffic to and from its own address,
// in both directions, and none of the first link's; cutting it leaves the
// first link working.
func TestAddLink(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 3})
	a := labtest.Host(t, lab, "a")
	a2, err := lab.AddLink(a, "a-nic2")
	require.NoError(t, err)
	require.NotEqual(t, a.IP, a2.IP)
	first, second := echoServer(t, a), echoServer(t, a2)
	local := lab.Local()

	roundTrip := func(addr string) error {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		msg := bytes.Repeat([]byte("two links"), 8192)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	require.NoError(t, roundTrip(second))
	require.Greater(t, lab.Stats(local, a2).Bytes, uint64(64<<10), "to the second link")
	require.Greater(t, lab.Stats(a2, local).Bytes, uint64(64<<10), "replies leave through the second link")
	require.Zero(t, lab.Stats(a, local).Bytes, "nothing through the first link")

	lab.Partition([]*netlab.Host{local}, []*netlab.Host{a2})
	require.Error(t, roundTrip(second), "the second link is cut")
	require.NoError(t, roundTrip(first), "the first link still works")
	require.Greater(t, lab.Stats(a, local).Bytes, uint64(64<<10))
}

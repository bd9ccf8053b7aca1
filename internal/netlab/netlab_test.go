package netlab_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
)

func TestMain(m *testing.M) { labtest.Main(m) }

// echoServer listens on h and echoes what it reads.
func echoServer(t *testing.T, h *netlab.Host) string {
	t.Helper()
	var ln net.Listener
	require.NoError(t, h.Do(func() (err error) { ln, err = net.Listen("tcp", h.Addr(0)); return }))
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func udpSocket(t *testing.T, h *netlab.Host) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	require.NoError(t, h.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.IP, 0)))
		return
	}))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TCP connects across the switch, from the local host and between two
// namespaced hosts; a two-way partition stops it and healing restores it.
func TestConnectPartitionHeal(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	a, b := labtest.Host(t, lab, "a"), labtest.Host(t, lab, "b")
	addr := echoServer(t, a)

	roundTrip := func(from *netlab.Host) error {
		var c net.Conn
		err := from.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, 500*time.Millisecond); return })
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		msg := bytes.Repeat([]byte("mooncake"), 4096) // several jumbo frames
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
	require.NoError(t, roundTrip(lab.Local()))
	require.NoError(t, roundTrip(b))

	lab.Partition([]*netlab.Host{a}, []*netlab.Host{b})
	require.Error(t, roundTrip(b), "a partitioned link carried a connection")
	require.NoError(t, roundTrip(lab.Local()), "the partition cut more than a-b")
	assert.Positive(t, lab.Stats(b, a).Dropped)

	lab.Heal()
	require.NoError(t, roundTrip(b))
}

// A one-way cut drops one direction only.
func TestOneWay(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	a, b := labtest.Host(t, lab, "a"), labtest.Host(t, lab, "b")
	ua, ub := udpSocket(t, a), udpSocket(t, b)
	lab.SetLink(a, b, netlab.Link{Down: true})

	_, err := ua.WriteTo([]byte("a->b"), ub.LocalAddr())
	require.NoError(t, err)
	_, err = ub.WriteTo([]byte("b->a"), ua.LocalAddr())
	require.NoError(t, err)

	buf := make([]byte, 16)
	_ = ua.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := ua.ReadFrom(buf)
	require.NoError(t, err, "b->a is not cut")
	assert.Equal(t, "b->a", string(buf[:n]))
	_ = ub.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _, err = ub.ReadFrom(buf)
	require.Error(t, err, "a->b is cut, yet b received")
}

// sendSeq sends n numbered datagrams from a to b and returns the numbers
// b received, in order of arrival.
func sendSeq(t *testing.T, a, b *net.UDPConn, n int, gap time.Duration) []uint32 {
	t.Helper()
	got := make(chan []uint32, 1)
	go func() {
		var seq []uint32
		buf := make([]byte, 64)
		for {
			_ = b.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			k, _, err := b.ReadFrom(buf)
			if err != nil {
				got <- seq
				return
			}
			seq = append(seq, binary.BigEndian.Uint32(buf[:k]))
		}
	}()
	for i := range n {
		var m [4]byte
		binary.BigEndian.PutUint32(m[:], uint32(i))
		_, err := a.WriteTo(m[:], b.LocalAddr())
		require.NoError(t, err)
		if gap > 0 {
			time.Sleep(gap)
		}
	}
	return <-got
}

func TestLoss(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 7})
	a, b := labtest.Host(t, lab, "a"), labtest.Host(t, lab, "b")
	ua, ub := udpSocket(t, a), udpSocket(t, b)
	lab.SetLink(a, b, netlab.Link{Loss: 0.2})
	got := sendSeq(t, ua, ub, 2000, 20*time.Microsecond)
	// 20% of 2000: 400 dropped expected, sd ~18; a wide band still catches
	// a switch that drops nothing or everything. (The receiving socket may
	// drop a few more on a loaded machine: the switch's counts are exact.)
	// (A few may be lost before the switch reads them, on a loaded
	// machine: the share is of what it read.)
	st := lab.Stats(a, b)
	seen := st.Packets + st.Dropped
	assert.LessOrEqual(t, seen, uint64(2000))
	assert.Greater(t, seen, uint64(1900))
	assert.InDelta(t, 0.2, float64(st.Dropped)/float64(seen), 0.06, "share dropped at 20%% loss")
	assert.LessOrEqual(t, uint64(len(got)), st.Packets)
	assert.Greater(t, len(got), 1400)
}

func TestDelayAndReorder(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 3})
	a, b := labtest.Host(t, lab, "a"), labtest.Host(t, lab, "b")
	ua, ub := udpSocket(t, a), udpSocket(t, b)

	lab.SetLinks([]*netlab.Host{a}, []*netlab.Host{b}, netlab.Link{Delay: 25 * time.Millisecond})
	buf := make([]byte, 8)
	start := time.Now()
	_, err := ua.WriteTo([]byte("ping"), ub.LocalAddr())
	require.NoError(t, err)
	_ = ub.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, from, err := ub.ReadFrom(buf)
	require.NoError(t, err)
	_, err = ub.WriteTo([]byte("pong"), from)
	require.NoError(t, err)
	_ = ua.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _, err = ua.ReadFrom(buf)
	require.NoError(t, err)
	rtt := time.Since(start)
	assert.GreaterOrEqual(t, rtt, 50*time.Millisecond, "two 25 ms legs")
	assert.Less(t, rtt, 500*time.Millisecond)

	lab.SetLink(a, b, netlab.Link{Delay: 5 * time.Millisecond, Reorder: 0.3})
	got := sendSeq(t, ua, ub, 300, 200*time.Microsecond)
	require.Zero(t, lab.Stats(a, b).Dropped, "reordering loses nothing")
	inversions := 0
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			inversions++
		}
	}
	assert.Positive(t, inversions, "30%% reordering delivered everything in order")
}

// A rate-limited host link carries a bulk TCP transfer at about its rate.
func TestRate(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	a := labtest.Host(t, lab, "a")
	var ln net.Listener
	require.NoError(t, a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Addr(0)); return }))
	defer ln.Close()
	const size = 8 << 20
	done := make(chan time.Duration, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		defer c.Close()
		start := time.Now()
		n, _ := io.Copy(io.Discard, c)
		if n != size {
			done <- 0
			return
		}
		done <- time.Since(start)
	}()
	const rate = 200e6 // bits per second
	a.SetRate(rate)
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_, err = c.Write(make([]byte, size))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	took := <-done
	require.Positive(t, took, "the transfer failed")
	got := float64(size*8) / took.Seconds()
	t.Logf("%.0f Mbit/s through a %.0f Mbit/s link", got/1e6, rate/1e6)
	assert.Less(t, got, rate*1.15, "the link ran faster than its rate")
	assert.Greater(t, got, rate*0.3, "the link ran far below its rate")
}

// A process started on a host sees the host's address.
func TestStartOnHost(t *testing.T) {
	lab := labtest.New(t, netlab.Config{})
	a := labtest.Host(t, lab, "a")
	var out bytes.Buffer
	cmd := exec.Command("ip", "-o", "-4", "addr", "show")
	cmd.Stdout = &out
	require.NoError(t, a.Start(cmd))
	require.NoError(t, cmd.Wait())
	assert.Contains(t, out.String(), a.IP.String()+"/16")
	assert.False(t, strings.Contains(out.String(), lab.Local().IP.String()+"/"), "the local host's address is in a's namespace")
}

// Hosts added at once get addresses of their own.
func TestHostsAtOnce(t *testing.T) {
	lab := labtest.New(t, netlab.Config{})
	hosts := make([]*netlab.Host, 4)
	var wg sync.WaitGroup
	for i := range hosts {
		wg.Go(func() {
			h, err := lab.Host(fmt.Sprintf("h%d", i))
			assert.NoError(t, err)
			hosts[i] = h
		})
	}
	wg.Wait()
	seen := map[string]bool{lab.Local().IP.String(): true}
	for _, h := range hosts {
		require.NotNil(t, h)
		require.False(t, seen[h.IP.String()], "%s given twice", h.IP)
		seen[h.IP.String()] = true
	}
}

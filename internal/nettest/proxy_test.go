package nettest

import (
	"io"
	"net"
	"testing"
	"time"
)

// echo listens on loopback and echoes what it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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

// Bytes pass both ways; while a direction is held nothing of it arrives,
// and once released what waited arrives whole and in order.
func TestProxyHolds(t *testing.T) {
	p := NewProxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string) {
		t.Helper()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Fatalf("read %q, %v; want %q", got, err, msg)
		}
	}
	roundTrip("open")
	for name, hold := range map[string]func() func(){"requests": p.HoldRequests, "answers": p.HoldAnswers} {
		release := hold()
		if _, err := c.Write([]byte("held-" + name)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, err := c.Read(make([]byte, 64)); n != 0 || !isTimeout(err) {
			t.Fatalf("%s held: read %d bytes, %v", name, n, err)
		}
		release()
		release() // twice is once
		got := make([]byte, len("held-"+name))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "held-"+name {
			t.Fatalf("%s released: read %q, %v", name, got, err)
		}
		roundTrip("after-" + name)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

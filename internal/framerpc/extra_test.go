package framerpc

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// countingGRPC answers every call, counting them.
type countingGRPC struct{ calls *atomic.Int64 }

func (g countingGRPC) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	g.calls.Add(1)
	return nil
}

func (countingGRPC) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, nil
}

// goroutinesIn counts the goroutines whose stack has fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// Calls waiting on the first dial of a Conn whose server turns out not
// to speak framerpc go over gRPC with it: none dials again.
func TestFallbackWaitersDoNotDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	first := make(chan net.Conn, 1)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			if dials.Add(1) == 1 {
				first <- nc // held: the first dial waits for its preface
				continue
			}
			_ = nc.Close() // a hang-up: not framed
		}
	})
	var viaGRPC atomic.Int64
	c := NewConn(ConnConfig{Addr: ln.Addr().String(), GRPC: countingGRPC{&viaGRPC}, DialTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	ctx := ctxTimeout(t, 30*time.Second)
	const calls = 4
	errs := make(chan error, calls)
	call := func() {
		_, err := rpc(ctx, c, []byte("v"))
		errs <- err
	}
	go call()
	held := <-first
	for range calls - 1 {
		go call()
	}
	eventually(t, 10*time.Second, "the calls waiting on the first dial", func() bool {
		return goroutinesIn("framerpc.(*Conn).get") == calls
	})
	_ = held.Close() // the first dial: not framed
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if c.Framed() || viaGRPC.Load() != calls {
		t.Fatalf("Framed %v, %d calls over gRPC; want false, %d", c.Framed(), viaGRPC.Load(), calls)
	}
	if d := dials.Load(); d != 1 {
		t.Fatalf("%d dials of a server known not to speak framerpc, want 1", d)
	}
}

// A reply over the Conn's limit fails its call ResourceExhausted, as
// gRPC's does (a store client does not retry it, where it retries
// Unavailable until its RPC timeout), and costs the other calls on the
// connection nothing: one in flight gets its answer, and the next call
// goes over the same connection.
func TestConnReplyTooLarge(t *testing.T) {
	b := newBlocker()
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		if string(in.Value) == "big" {
			return wrapperspb.Bytes(make([]byte, 4<<10)), nil
		}
		return b.Call(ctx, in)
	}), serverOpts{})
	t.Cleanup(b.unblock) // before the server's stop, which waits for it
	c := newConn(t, s.addr, ConnConfig{MaxRecvMsgSize: 1 << 10})
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := rpc(ctx, c, []byte("first")); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	w := c.wire
	c.mu.Unlock()
	blocked := make(chan error, 1)
	go func() {
		v, err := rpc(ctx, c, []byte("block"))
		if err == nil && string(v) != "block" {
			err = fmt.Errorf("answered %q", v)
		}
		blocked <- err
	}()
	b.waitStarted(t)
	_, err := rpc(ctx, c, []byte("big"))
	wantCode(t, err, codes.ResourceExhausted)
	b.unblock()
	if err := <-blocked; err != nil {
		t.Fatalf("the call in flight beside a reply too large: %v", err)
	}
	if v, err := rpc(ctx, c, []byte("next")); err != nil || string(v) != "next" {
		t.Fatalf("the call after a reply too large: %q, %v", v, err)
	}
	c.mu.Lock()
	same := c.wire == w
	c.mu.Unlock()
	if !same || w.lost() {
		t.Fatal("a reply too large cost the connection")
	}
}

package framerpc

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// goid is the calling goroutine's id, from its stack's header.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := bytes.Fields(b)
	if len(f) < 2 {
		return ""
	}
	return string(f[1])
}

// A connection's calls one after another run on a worker kept from the
// calls before, and a burst of calls leaves at most idleWorkers waiting.
func TestWorkersKeptBetweenCalls(t *testing.T) {
	b := newBlocker()
	var mu sync.Mutex
	ran := map[string]bool{}
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		mu.Lock()
		ran[goid()] = true
		mu.Unlock()
		return b.Call(ctx, in)
	}), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := rpc(ctx, c, []byte("first")); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		v := []byte(strconv.Itoa(i))
		if got, err := rpc(ctx, c, v); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
	}
	if !c.Framed() || s.paths.framed.Load() != 51 {
		t.Fatalf("%d of 51 calls framed (Framed %v)", s.paths.framed.Load(), c.Framed())
	}
	mu.Lock()
	n := len(ran)
	mu.Unlock()
	// A worker that has answered may not be waiting yet when the next
	// call is read: then another takes it.
	if n > 3 {
		t.Fatalf("51 calls in a row ran on %d goroutines, want them kept", n)
	}

	before := runtime.NumGoroutine()
	const burst = 4 * idleWorkers
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			if _, err := rpc(ctx, c, []byte("block")); err != nil {
				t.Error(err)
			}
		})
	}
	for range burst {
		b.waitStarted(t)
	}
	b.unblock()
	wg.Wait()
	// The burst's workers beyond idleWorkers end; the callers' have.
	eventually(t, 10*time.Second, "the burst's workers down to idleWorkers", func() bool {
		return runtime.NumGoroutine() <= before+idleWorkers
	})
}

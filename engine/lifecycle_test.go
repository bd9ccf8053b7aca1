package engine_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/transporttest"
)

// TestCloseWhilePublishing: peers ask for this engine's descriptor and
// memory is registered and unregistered while it closes. The descriptor
// reads state of the same-host path (its control page); Close must not
// release that under a reader (it once did: the process died of a fault).
func TestCloseWhilePublishing(t *testing.T) {
	for round := range 20 {
		e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1"})
		require.NoError(t, err)
		mem := anonMem(t, 1<<16)
		rpc := net.JoinHostPort("127.0.0.1", strconv.Itoa(e.RPCPort()))
		var stop atomic.Bool
		var wg sync.WaitGroup
		asked := make(chan struct{}, 1)
		for range 2 {
			wg.Go(func() {
				for !stop.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					_, err := metadata.Call(ctx, rpc, metadata.TypeMetadata, []byte(`{}`), nil)
					cancel()
					if err == nil {
						select {
						case asked <- struct{}{}:
						default:
						}
					}
				}
			})
		}
		wg.Go(func() {
			for !stop.Load() {
				if e.RegisterMemory(context.Background(), addr(mem), uint64(len(mem)), "", true) == nil {
					e.UnregisterMemory(context.Background(), addr(mem))
				}
			}
		})
		<-asked // the descriptor is being served
		require.NoError(t, e.Close(), "round %d", round)
		stop.Store(true)
		wg.Wait()
	}
}

// TestRegisterUndoneWhenPublishFails: a registration whose descriptor
// cannot be published leaves nothing registered, so the caller may free
// the memory; AllocateBuffer frees its own. Unregistering goes through
// even then, and says the publishing failed.
func TestRegisterUndoneWhenPublishFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- metadata.NewServer().Serve(ctx, ln) }()
	stopped := false
	stopServer := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-served)
		}
	}
	t.Cleanup(stopServer)
	e := newEngine(t, engine.Config{Metadata: "http://" + ln.Addr().String() + "/metadata", Transport: "tcp"})
	kept := anonMem(t, 1<<16)
	require.NoError(t, e.RegisterMemory(context.Background(), addr(kept), uint64(len(kept)), "", true))

	stopServer() // publishing fails from now on
	mem := anonMem(t, 1<<16)
	require.ErrorIs(t, e.RegisterMemory(context.Background(), addr(mem), uint64(len(mem)), "", true), engine.ErrMetadata)
	_, err = e.AllocateBuffer(context.Background(), 1<<16, "cpu:0")
	require.ErrorIs(t, err, engine.ErrMetadata)
	bufs, err := e.SegmentBuffers(engine.LocalSegment)
	require.NoError(t, err)
	require.Len(t, bufs, 1, "only the region registered before")
	require.Equal(t, uint64(addr(kept)), bufs[0].Addr)

	err = e.UnregisterMemory(context.Background(), addr(kept))
	require.ErrorIs(t, err, engine.ErrMetadata)
	require.ErrorContains(t, err, "unregistered")
	bufs, err = e.SegmentBuffers(engine.LocalSegment)
	require.NoError(t, err)
	require.Empty(t, bufs, "the region is gone all the same")
	require.ErrorIs(t, e.UnregisterMemory(context.Background(), addr(kept)), engine.ErrAddressNotRegistered)
}

// TestCloseSegmentFailsHeldSlices: closing a segment closes its paths,
// which fail the slices they still hold; the tasks end Failed.
func TestCloseSegmentFailsHeldSlices(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, 2*seamSlice)
	kept := sm.take(t, 1)[0]
	require.NoError(t, sm.init.CloseSegment(sm.seg))
	transporttest.Move(kept)
	st := sm.wait(t, b)
	require.Equal(t, engine.Failed, st.Status)
	require.ErrorIs(t, st.Err, transport.ErrClosed)
}

// TestContextDeadlineIsTimeout: a slice that failed because the Submit's
// context ran out before it was queued makes its task Timeout.
func TestContextDeadlineIsTimeout(t *testing.T) {
	sm := newSeam(t, &transporttest.Fake{})
	b := sm.read(t, 0, seamSlice)
	transporttest.Fail(sm.take(t, 1)[0], context.DeadlineExceeded)
	require.Equal(t, engine.Timeout, sm.wait(t, b).Status)
}

package engine_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// TestErrorKeepsCause: an *Error matches its code's sentinel and, through
// Unwrap, the error it was built from; its text names both.
func TestErrorKeepsCause(t *testing.T) {
	err := error(&engine.Error{Code: engine.CodeSocket, Msg: "probe x", Err: io.ErrUnexpectedEOF})
	require.ErrorIs(t, err, engine.ErrSocket)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.NotErrorIs(t, err, engine.ErrMetadata)
	require.Equal(t, io.ErrUnexpectedEOF, errors.Unwrap(err))
	require.Equal(t, "engine: probe x: unexpected EOF", err.Error())
	require.Equal(t, "engine: unexpected EOF", (&engine.Error{Code: engine.CodeSocket, Err: io.ErrUnexpectedEOF}).Error())
	require.Equal(t, "engine: batch busy", engine.ErrBatchBusy.Error())
	require.Nil(t, errors.Unwrap(engine.ErrBatchBusy))
	require.Equal(t, engine.CodeSocket, engine.CodeOf(err))
}

// TestContextErrorsSurvive: calls whose context ends fail with an error
// that is both the engine's code and the context's error, over real
// sockets: a cancelled OpenSegment and Wait, and a Probe of a peer that
// accepts the handshake connection but never answers.
func TestContextErrorsSurvive(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	init := newEngine(t, engine.Config{Transport: "tcp"})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	_, err := init.OpenSegment(cancelled, target.Name())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, engine.ErrSocket)

	b, err := init.AllocateBatch(1)
	require.NoError(t, err)
	mem := anonMem(t, 4096)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(mem), uint64(len(mem)), "", false))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	require.NoError(t, init.Submit(context.Background(), b, []engine.Request{{Op: engine.Write, Local: addr(mem), Segment: seg,
		Remote: 1 << 40, Length: 16}}))
	_, err = init.Wait(cancelled, b)
	require.ErrorIs(t, err, context.Canceled)
	_, err = init.Wait(context.Background(), b) // let the batch end before it is freed
	require.NoError(t, err)
	require.NoError(t, init.FreeBatch(b))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // hold it open and silent until the test ends
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case c := <-held:
			c.Close()
		default:
		}
	})
	ctx, stop := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer stop()
	err = init.Probe(ctx, ln.Addr().String())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, engine.ErrSocket)
}

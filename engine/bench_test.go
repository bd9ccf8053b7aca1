package engine_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// BenchmarkTransfer measures batches of 64 requests through each path, in
// one process (the `mooncake bench te` command runs separate processes).
// BenchmarkLoopbackTCP is the yardstick to divide by.
func BenchmarkTransfer(b *testing.B) {
	for _, bc := range []struct {
		name      string
		transport string
		op        engine.Op
		block     uint64
	}{
		{"tcp/write/1MiB", "tcp", engine.Write, 1 << 20},
		{"tcp/read/1MiB", "tcp", engine.Read, 1 << 20},
		{"tcp/write/128KiB", "tcp", engine.Write, 128 << 10},
		{"shm/write/1MiB", "auto", engine.Write, 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const batch = 64
			target, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Transport: bc.transport, Logger: quiet})
			require.NoError(b, err)
			defer target.Close()
			init, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Transport: bc.transport, Logger: quiet})
			require.NoError(b, err)
			defer init.Close()
			size := int(bc.block * batch)
			dst, err := target.AllocateBuffer(context.Background(), size, "")
			require.NoError(b, err)
			src, err := init.AllocateBuffer(context.Background(), size, "")
			require.NoError(b, err)
			seg, err := init.OpenSegment(context.Background(), target.Name())
			require.NoError(b, err)
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				off := uint64(i) * bc.block
				reqs[i] = engine.Request{Op: bc.op, Local: src.Addr() + uintptr(off), Segment: seg, Remote: uint64(dst.Addr()) + off, Length: bc.block}
			}
			id, err := init.AllocateBatch(batch)
			require.NoError(b, err)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				require.NoError(b, init.Submit(context.Background(), id, reqs))
				st, err := init.Wait(context.Background(), id)
				if err != nil || st.Status != engine.Completed {
					b.Fatalf("%v %v", st, err)
				}
				require.NoError(b, init.FreeBatch(id))
				id, _ = init.AllocateBatch(batch)
			}
		})
	}
}

func BenchmarkLoopbackTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for range b.N {
		c.Write(buf)
	}
}

var quiet = slog.New(slog.DiscardHandler)

package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/mooncake-go/mooncake/engine"
)

// Two engines in one process: the target registers a buffer, the
// initiator opens the target's segment by name and writes into it, then
// reads it back. Between processes or hosts the calls are the same.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)

	target, err := engine.New(ctx, engine.Config{Host: "127.0.0.1", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer target.Close()
	remote, err := target.AllocateBuffer(ctx, 1<<20, "cpu:0") // memfd-backed, remote-accessible
	if err != nil {
		panic(err)
	}
	defer remote.Free()

	init, err := engine.New(ctx, engine.Config{Host: "127.0.0.1", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer init.Close()
	local, err := init.AllocateBuffer(ctx, 1<<20, "cpu:0")
	if err != nil {
		panic(err)
	}
	defer local.Free()
	seg, err := init.OpenSegment(ctx, target.Name())
	if err != nil {
		panic(err)
	}

	move := func(op engine.Op, n int) engine.TransferStatus {
		b, err := init.AllocateBatch(1)
		if err != nil {
			panic(err)
		}
		defer init.FreeBatch(b)
		req := engine.Request{Op: op, Local: local.Addr(), Segment: seg, Remote: uint64(remote.Addr()), Length: uint64(n)}
		if err := init.Submit(ctx, b, []engine.Request{req}); err != nil {
			panic(err)
		}
		st, err := init.Wait(ctx, b)
		if err != nil {
			panic(err)
		}
		return st
	}
	msg := "hello, segment"
	copy(local.Bytes(), msg)
	st := move(engine.Write, len(msg))
	fmt.Println(st.Status, st.Transferred, string(remote.Bytes()[:len(msg)]))

	clear(local.Bytes())
	st = move(engine.Read, len(msg))
	fmt.Println(st.Status, string(local.Bytes()[:len(msg)]))
	// Output:
	// completed 14 hello, segment
	// completed hello, segment
}

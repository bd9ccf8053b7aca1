// Package te benchmarks our Transfer Engine against a yardstick measured in
// the same run.
//
// An initiator engine reads or writes a target engine's buffer in batches of
// equal requests, from one or more workers, for a fixed duration. The target
// runs in a child process by default (Exec), as it would in production, or
// in this process (InProcess). Each measurement is followed by its
// yardstick, so both see the same machine state:
//
//   - tcp: loopback TCP streams between this process and a sink child, with
//     as many connections as the engine has lanes and with one; the better
//     of the two is the yardstick;
//   - shm: a single-thread memcpy of block-size chunks between two buffers
//     of at least 256 MiB.
//
// Run repeats the pair Options.Repeat times and reports medians and the
// ratio ours / yardstick. It measures for Options.Planned (Repeat x
// Phases x Duration: 3 x 3 x 5 s for tcp by default), plus start-up, and
// says so first on Options.Progress (PlanLine), where its progress follows. Throughput is in GB/s of 1e9 bytes. Latency is
// per request, from Submit to the return of Wait on its batch, kept in a
// log-linear histogram (bounded memory, 1.6% resolution).
//
// Lifecycle: Run starts the target and the sink through the Launcher, our
// engine and its buffer, opens the target segment, makes one untimed pass
// over the buffers (lanes dial, shared pages map), measures, then closes our
// engine and stops the children, waiting for them. A failed request aborts
// the benchmark with an error naming it.
//
// The command line is "mooncake bench te"; its hidden commands
// "bench te target" and "bench te tcp-sink" call ServeTarget and ServeSink.
//
//	res, err := te.Run(ctx, te.Options{Transport: "tcp", Op: engine.Write,
//		BlockSize: 1 << 20, Threads: 2, Duration: 5 * time.Second})
//	if err != nil {
//		return err
//	}
//	res.WriteTable(os.Stdout)
package te

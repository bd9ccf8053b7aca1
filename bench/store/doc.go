// Package store benchmarks a KV store's puts and gets, and measures the
// yardsticks ours is compared with in the same run: Redis, the official
// Mooncake Store, and two floors, what the same calls cost at best over
// loopback TCP and in shared memory.
//
// A run (Options) is one operation, put or get, of objects of one size,
// BatchSize of them per call, from Clients concurrent clients calling in a
// loop: Warmup untimed, then Duration timed. A get run first preloads a
// working set of Keys objects, which the clients then read in turn; a put
// run writes keys never written before, since a KV cache stores new blocks
// and a store may treat the put of an existing key as a no-op (the official
// one does). Every yardstick's store gets the same memory, twice a get
// run's working set and at least 512 MiB, and evicts once it is full; the
// floors (tcp, memcpy) hold the working set alone.
//
// The figures (Result): objects per second, GB/s of values (1e9 bytes,
// keys not counted) and the 50th and 99th percentiles of the latency of one
// call, whole batch included, kept in a log-linear histogram (1.6%
// resolution). One run is noisy: repeat it and take the Median; WriteTable
// prints results with their ratio to a yardstick at the same point, and to
// each floor measured: "x tcp" is the ratio to read for the rows whose
// bytes cross loopback TCP (remote, redis), "x memcpy" for the same-host
// and local ones. FloorRatios sets the same ratios in the results (XTCP,
// XMemcpy; x_tcp and x_memcpy in JSON).
//
// The systems:
//
//   - ours, or any store: Drive runs Options through a Worker per client,
//     one goroutine each. The caller names the result (Ours).
//   - Redis (RunRedis): a redis-server child process (the Debian package)
//     on a free loopback port, persistence off, maxmemory with allkeys-lru
//     eviction, driven by Drive through a small hand-written RESP2 client,
//     one connection per client. A batch is one MSET or MGET (SET or GET
//     for one object): one round trip per call, as for the other systems.
//     Redis executes every command on one thread; io-threads stays off.
//   - the official Mooncake Store (RunOfficial): the PyPI wheel
//     mooncake-transfer-engine-non-cuda, its mooncake_master with the HTTP
//     metadata server on free loopback ports, and one Python process per
//     client (official_store.py, embedded) so that no client waits on
//     another's GIL, making zero-copy batch_put_from / batch_get_into calls
//     on registered memory over protocol "tcp". Two topologies: Remote, a
//     storage process holding the only segment, so every byte crosses
//     loopback TCP between processes, as Redis's do; and Local, every
//     client holding its own segment and objects, so the official client
//     copies in memory.
//   - the tcp floor (RunTCP, topology Remote): a server child process
//     (TCPServer, "mooncake bench store tcp-server") holding the working
//     set in one mapped buffer, one loopback connection per client, one
//     request per call. A get names the batch's objects and the server
//     writes their bytes back from its buffer in one writev, which the
//     client reads into its memory; a put is the request and the values in
//     one writev, read by the server straight into its buffer, then one
//     ack byte. Sockets keep the kernel's default buffer sizes with Nagle
//     off, as the engine's TCP transport does. No store over loopback TCP
//     can move the same bytes in fewer copies or round trips.
//   - the memcpy floor (RunMemcpy, topology SameHost): the working set in a
//     memfd mapping, and each client, on its own goroutine, copying a
//     batch's values between it and its own memory per call. No server:
//     what a same-host read or write costs at best.
//
// The floors keep a minimal index (which key is in which slot, behind one
// lock; puts evict the oldest objects once the working set is full), so
// that their calls fail on a missing key as a store's do.
//
// Lifecycle: each Run function starts a fresh server (and, for the official
// store, its processes), measures once and stops them all, waiting for
// them; every child is also killed should this process die. Drive makes its
// workers, measures and closes them; it wants a store holding none of its
// keys (a fresh one, or a new Options.KeyPrefix per run).
//
//	o := store.Options{Op: store.OpGet, ValueSize: 1 << 20, Clients: 2,
//		Duration: 5 * time.Second, Warmup: time.Second}
//	var runs []store.Result
//	for range 3 {
//		r, err := store.RunRedis(ctx, o, store.RedisConfig{})
//		if err != nil {
//			return err
//		}
//		runs = append(runs, r)
//	}
//	official, err := store.RunOfficial(ctx, o, store.OfficialConfig{})
//	if err != nil {
//		return err
//	}
//	store.WriteTable(os.Stdout, []store.Result{store.Median(runs), official}, store.Redis)
//
// The command line is "mooncake bench store".
package store

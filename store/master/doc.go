// Package master is the Mooncake Store master: the metadata service that
// clients talk to over gRPC (store/storepb), and also as frames on the
// same port, inside TLS when it serves TLS (internal/framerpc: the same
// services, interceptors and limits, about half gRPC's latency for a small
// call), which store clients use. It owns the map from object keys
// to replicas, allocates replica space in the segments that clients mount
// into the pool, grants leases on reads, evicts near-LRU objects past a high
// watermark (spilling them to SSD tiers where nodes have one), and, under
// HA, keeps one leader among several masters through etcd with a journal
// that loses no completed put. It is never in the data path: clients move
// bytes with the Transfer Engine between each other's segments, at the
// offsets the master handed out.
//
//	m, _ := master.Start(master.ServerConfig{Listen: ":50051", Admin: ":9003"})
//	defer m.Close()
//	// clients: client.New(ctx, client.Config{Master: "host:50051"})
//
// # Pieces
//
//   - Allocation: one store/alloc.Allocator (O(1) two-level segregated
//     fit) per mounted segment.
//   - Service (service.go, segments.go, objects.go, evict.go, tier.go): the
//     metadata core with Mooncake's semantics — write-once put and upsert,
//     leases granted on reads (10 s), soft and hard pins, eviction at 0.90
//     freeing 0.05 near-LRU (by lease time, in O(objects evicted): each
//     shard keeps the objects an eviction may take in heaps by lease,
//     evict_order.go), client liveness (1 s pings, 10 s TTL), zombie
//     puts pre-empted (30 s) and reclaimed (10 min), Mooncake's error codes;
//     and the SSD tier (offload after put, spill on eviction, promotion on
//     hit), whose copies clients make when their pings hand them moves.
//   - GRPCServer (grpc.go): the storepb.Master service; store errors travel
//     in Results so batches fail item by item.
//   - Watch (watch.go): the readable keys, then every key that becomes
//     readable or stops being (put ended; removed; evicted or lost with
//     its segment), for the Conductor's prefix index (WatchObjects). A
//     watcher never slows the master: one that falls behind is dropped
//     and watches again from a new snapshot.
//   - KV events (kvevents.go, docs/kv-events.md): with
//     ServerConfig.KVEvents the leader publishes a stored or removed event
//     per key and medium on a ZMQ PUB socket, as mooncake_master
//     --enable_kv_events, with a replay socket; a bounded queue and one
//     sender goroutine keep it off the request path.
//   - Server (server.go): a running master — the service, its background
//     loop, gRPC, the admin HTTP server (admin*.go, metrics*.go; every
//     endpoint and metric of mooncake_master's, mapped in
//     docs/master-http.md: /metrics with Mooncake's metric names,
//     /metrics/summary, /health, /role, /ha_status, /leader, the
//     inspection endpoints /get_all_segments, /query_segment,
//     /get_segments_detail, /get_all_keys, /query_key, /batch_query_keys,
//     and /api/v1 segment status, drain jobs and remove_all) and HA.
//   - HA (journal.go, etcdjournal.go, with store/ha): the leader holds
//     mooncake-store/<cluster>/master_view under an etcd lease; standbys
//     answer Unavailable. Every durable change is journaled to etcd in
//     order, in transactions fenced by the leader's term, and group
//     committed; answers wait for their records (until the call's context
//     ends: the cause of its error is then the context's), and freed space
//     is reused only once the record freeing it is durable. Snapshots every
//     HAConfig.SnapshotEvery records (by default 100000, or four per
//     object held, whichever is more) bound the log. A new leader loads the
//     latest snapshot and the records after it, rebuilds the allocators
//     from the live replicas, gives every object a fresh lease (readers of
//     the old leader may still be copying) and serves.
//   - Standby acknowledgements (replicate.go): a warm standby fetches the
//     leader's records as they are appended (JournalFetch); the leader
//     designates one that keeps up, in etcd, and a record is durable once
//     that standby has it or etcd does, etcd being written behind. A new
//     leader takes the designated standby's records (its own, or asked of
//     it over JournalTail) and writes to etcd those etcd lacks before it
//     loads. HAConfig.SyncEtcd [--ha_sync_etcd] turns this off.
//
// # Limits
//
// No client can make the master hold unbounded memory or reserve the pool
// in one request. Each limit has a default and a field (mooncake master
// flag in brackets); a refused request applies nothing and its message
// names the limit and the value:
//
//   - ServiceConfig.MaxKeyLen [--max_key_length], 4 KiB: a longer key is
//     INVALID_PARAMS on every call that takes one.
//   - ServiceConfig.MaxValueLen [--max_value_size], 1 TiB: a put or
//     upsert of a larger value is INVALID_PARAMS (its item, in a batch).
//   - ServiceConfig.MaxBatch [--max_batch_size], 65536 keys, and
//     MaxBatchValueBytes [--max_batch_value_size], 16 TiB of values in one
//     batch put: a batch over either is refused whole with the gRPC status
//     InvalidArgument (the Go client reads it as INVALID_PARAMS), since
//     answering item by item would cost as much as the batch.
//   - ServiceConfig.MaxWatchers [--max_watchers], 256 WatchObjects
//     streams at once (each buffers DefaultWatchBuffer events): one more
//     ends with ResourceExhausted.
//   - KVEventsConfig.MaxSubscribers [--kv_events_max_subscribers], 256
//     connections each on the KV events PUB and replay sockets; more are
//     closed unserved. A peer has 5 s for its ZMTP handshake and may send
//     no frame over 64 KiB (kvlimit.go).
//   - ServerConfig.MaxRecvMsgSize [--max_request_size], 256 MiB: a larger
//     request (gRPC or framed) fails with ResourceExhausted before it is
//     decoded.
//   - ServerConfig.MaxConcurrentStreams [--max_concurrent_streams], 1024
//     calls in flight per client connection; gRPC clients queue the rest,
//     a framed connection is not read further until one ends.
//   - ServerConfig.MaxConns [--max_connections], 16384 connections (gRPC
//     and framed),
//     and MaxConnsPerPeer [--max_connections_per_peer], 1024 from one IP
//     address; the admin HTTP server takes 1024, 64 from one address.
//     Connections over a limit are closed as they are accepted, and
//     logged.
//   - ServerConfig.MaxAdminBody [--max_admin_body], 64 KiB: a longer admin
//     HTTP request body (declared or chunked) is answered 413. The admin
//     endpoints take their parameters in the URL, which net/http bounds
//     with the headers (1 MiB).
//
// # Security
//
// Open by default, as Mooncake's master, so that its clients work
// unchanged. Two locks, independent, best used together
// (internal/secure):
//
//   - ServerConfig.Token [--auth_token, --auth_token_file, MC_AUTH_TOKEN]:
//     every gRPC call, unary or stream, and every admin request must carry
//     "authorization: Bearer <token>" (compared in constant time); others
//     are answered codes.Unauthenticated ("missing bearer token", "wrong
//     bearer token") or 401, before any other interceptor or handler
//     runs. RemoveAll and every other mutating call are behind it.
//     ServerConfig.OpenProbes [--auth_open_probes] lets GET /health,
//     /readyz and /metrics through without it, for probes and scrapers
//     that cannot present one: they disclose counts, not keys or
//     segments; every other admin endpoint still requires it.
//   - ServerConfig.TLS [--tls_cert_file, --tls_key_file]: gRPC and the
//     admin server speak TLS; with a CAFile [--tls_client_ca_file] it is
//     mutual, and a client without a certificate that CA signed fails its
//     handshake; on the admin server too, so probes of a mutual-TLS
//     master present a certificate (OpenProbes waives the token only).
//     HAConfig.EtcdTLS [--etcd_tls_*] dials etcd over TLS.
//
// Store clients present them with client.Config.Token, MasterTLS and
// EtcdTLS (mooncake node --auth_token, --master_tls_*, --etcd_tls_*).
//
// # Allocation
//
// Each mounted segment has an alloc.Allocator over its offsets [0, size);
// the master adds the segment's base address. The allocator lives in the
// leaf package store/alloc because clients use it too (their staging
// buffer), and a client must not link the master. The master serialises
// the calls on each segment.
package master

// Package p2p is the P2P Store: it shares large, immutable objects (model
// checkpoints, mostly) among many nodes, BitTorrent-like, so that a seed
// serving N receivers uploads about one copy rather than N.
//
// A seed registers an object made of its local buffers; nothing moves yet,
// the Store only writes the object's description to etcd. A receiver
// fetches it into its own buffers with the Transfer Engine, shard by shard,
// and then publishes itself as a source of those shards. Later receivers
// pick replica holders before the seed, so the seed's upload stays near one
// copy however many nodes fetch.
//
// # Lifecycle
//
// New connects to etcd and starts an engine (or uses Config.Engine).
//
//	s, _ := p2p.New(ctx, p2p.Config{Metadata: "etcd://10.0.0.1:2379"})
//	defer s.Close()
//
//	// On the seed: buffers must stay untouched until Unregister.
//	s.Register(ctx, "llama/shard-00", addrs, sizes, 64<<20, "cpu:0", false)
//	...
//	s.Unregister(ctx, "llama/shard-00")
//
//	// On a receiver: buffers of the same total size, split any way.
//	s.GetReplica(ctx, "llama/shard-00", myAddrs, mySizes)
//	...
//	s.DeleteReplica(ctx, "llama/shard-00")
//
// Buffers are any memory of this process (mmap, C, or an engine
// AllocateBuffer); the Store registers them with the engine, remote
// accessible, in chunks of at most 4 GiB, counting references so the same
// buffer may back several objects. Close withdraws everything this node
// serves from etcd, unregisters its memory and closes the engine it
// started.
//
// # Metadata
//
// Each object is one etcd key, mooncake/checkpoint/<name>, whose JSON value
// is Mooncake's:
//
//	{"name": "...", "size": 1024, "size_list": [512, 512], "max_shard_size": 256,
//	 "shards": [{"size": 256, "gold": [{"segment_name": "10.0.0.2:15001", "offset": 140183...}],
//	             "replica_list": [...]}, ...]}
//
// Shards tile the object in order; each names its seed copies (gold) and
// replica copies by engine segment name and absolute address there.
// Register without forceCreate is a transaction on the key not existing;
// every later change (a receiver adding itself, a node withdrawing) is a
// compare-and-swap on the revision it read, retried on conflict. An object
// nobody serves any more is deleted.
//
// # Fetching
//
// GetReplica reads Config.Concurrency shards at a time, one engine READ per
// piece of a shard that falls in one local buffer. A shard's first attempt
// goes to a random replica holder (a seed when there is none); when a
// source fails (it died, or withdrew) later attempts walk the seeds and then
// the replicas, at least Config.Retries times and once per source. Before
// publishing itself the receiver checks that the object was not replaced
// meanwhile, and fetches it again if it was. A receiver only becomes a
// source of the shards that landed whole inside one of its buffers.
package p2p

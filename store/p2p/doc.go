// Package p2p is the P2P Store: it shares large, immutable objects (model
// checkpoints, mostly) among many nodes, BitTorrent-like, so that a seed
// serving N receivers uploads about one copy rather than N.
//
// A seed registers an object made of its local buffers; nothing moves yet,
// the Store only writes the object's description to etcd. A receiver
// fetches it into its own buffers with the Transfer Engine, shard by shard,
// and publishes itself as a source of each shard soon after it lands.
// Receivers read from replica holders before the seed, and split among
// themselves the shards only the seed has, so the seed's upload stays near
// one copy however many nodes fetch, together or one after another.
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
// GetReplica runs Config.Concurrency workers, one engine READ per piece of
// a shard that falls in one local buffer, and beside them a watch on the
// object's key, so the receiver always knows who serves what. Each worker
// takes, in order of preference:
//
//   - a shard some other receiver already serves, the rarest first, read
//     from a random one of them: it costs the seed nothing, and spreads
//     what receivers hold among them;
//   - a shard only a seed serves that this receiver owns. The receivers a
//     node knows of (from the replica lists) split those shards by
//     rendezvous hashing on segment name and shard, so receivers that
//     started together ask the seed for different shards and take the
//     rest from one another; each tries its heaviest shards first, those
//     it is likeliest to keep whoever else turns up;
//   - a shard another receiver owns, once this one has waited for it
//     about two of its slowest reads and publishes: the owner may be dead
//     or unable to serve it.
//
// A receiver cannot know who else fetches before it has published once
// and seen the record as of then. Until then it reads a single shard from
// the seeds, and for as long again as it would wait for an owner it reads
// one at a time (those that started with it may not have published yet);
// later it keeps its part of Concurrency among the receivers it knows of
// in flight there, so the seeds serve about Concurrency reads at a time.
// With four receivers starting together on a 16-shard object the seed
// uploads 1.0 to 1.5 copies (TestSeedUploadUnderTwice), where reading
// replicas first alone left it near four.
//
// Landed shards are published in batches (four of them, or what landed
// within 20 ms), each one compare-and-swap that also brings the receiver's
// view up to date; a failed swap returns the current record, so a retry
// costs one round trip. A shard read from a source that fails (it died, or
// withdrew) is tried from the others, untried replica holders first, then
// seeds, at least Config.Retries times and once per source; a failed
// segment is avoided for the rest of the fetch. Before returning, the
// receiver checks that the object was not replaced meanwhile, and fetches
// it again if it was; a GetReplica that fails withdraws what it published.
// A receiver only becomes a source of the shards that landed whole inside
// one of its buffers.
package p2p

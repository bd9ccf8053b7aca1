// Package p2p is the P2P Store: it shares large, immutable objects (model
// checkpoints, mostly) among many nodes, BitTorrent-like, so that a seed
// serving N receivers uploads about one copy rather than N.
//
// A seed registers an object made of its local buffers; nothing moves yet,
// the Store only writes the object's description to etcd. A receiver
// fetches it into its own buffers with the Transfer Engine, shard by shard,
// and publishes itself as a source of each shard soon after it lands.
// Receivers read from replica holders before the seed, and claim among
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
// a shard that falls in one local buffer, and beside them watches on the
// object's key and on its claim directory, so the receiver always knows
// who serves what and who fetches it now. The claim directory,
// mooncake/p2p-claims/<create revision>/<name>/, is this project's own
// (Mooncake's record is left as Mooncake writes it); each receiver's
// entries there live under an etcd lease of its pass (claimTTL, 10 s,
// kept alive while it runs, renewed if it ran out anyway, revoked when it
// ends; a Store deletes the f/ and h/ entries of its segment name when it
// starts, and a receiver its h/ entries when it joins, since a previous
// life's would name buffers that hold nothing yet):
//
//   - f/<segment>: the receiver is fetching; written before it asks a
//     seed for anything;
//   - s/<shard>: the receiver that reads this shard from a seed, written
//     by a transaction on the key not existing, so exactly one receiver
//     claims each shard; a receiver alone claims several at once, twice as
//     many after each batch it won whole, up to 32, so that small shards
//     do not each wait a round trip; one at a time as soon as another
//     receiver fetches;
//   - h/<segment>/<n>: shards the receiver landed and their addresses,
//     its nth announcement, a plain put of a key of its own per batch
//     (batched as below; what is announced grows with the shards, not
//     their square):
//     others read from it a round trip after a shard lands, where a
//     publication in the record, which every receiver edits by
//     compare-and-swap, took seconds of retries with eight receivers on
//     lossy links.
//
// Each worker takes, in order of preference:
//
//   - while a seed slot is free, a shard that nobody holds or has claimed,
//     which it claims and reads from a seed: the seed sends every shard
//     once before it sends any twice, and stays busy while shards remain
//     that no receiver has. A receiver keeps its part of Concurrency among
//     the receivers fetching (at least one) in flight at the seeds, one
//     alone Concurrency, enough to fill its link; until its first seed
//     read lands, one, since those that start with it may not have entered
//     the directory yet;
//   - a shard other receivers serve, from the holder it reads least from
//     now (at random among those), the rarest shard that holder has: the
//     rarest shards spread first, without every receiver queueing at the
//     one holder of the newest shard while other links idle;
//   - a shard nobody holds that it cannot serve (split over its buffers),
//     so does not claim: from a seed when no other receiver fetches, else
//     as the next kind;
//   - a shard another receiver claimed, once it has had nothing else to do
//     and the claim is older than two of its average reads and
//     announcements (the endgame): the claimant may be slow (one TCP flow
//     stuck in retransmission backoff held a whole swarm for seconds) or
//     dead. A dead receiver's claims also go with its lease.
//
// With eight receivers starting together on a 32-shard object, no shard is
// read from the seed twice before every shard was read from it once, or
// claimed for that read (TestSeedSendsEachShardOnceFirst), and four receivers of a 16-shard
// object have the seed upload about one copy (TestSeedUploadUnderTwice).
//
// Landed shards are announced and published in batches (four of them, or
// what landed within 20 ms): announced on a new h/ key, and
// published in the record, each batch one compare-and-swap that also
// brings the receiver's view up to date (a failed swap returns the
// current record, so a retry costs one round trip). The record keeps the
// receiver as a source after its pass, when its claim-directory entries
// are gone; the pass publishes what is left before it leaves. A shard read
// from a source that fails (it died, or withdrew) is tried from the
// others, untried replica holders first, then seeds, at least
// Config.Retries times and once per source; a failed segment is avoided
// for the rest of the fetch. Before returning, the
// receiver checks that the object was not replaced meanwhile, and fetches
// it again if it was; a GetReplica that fails withdraws what it published.
// A receiver only becomes a source of the shards that landed whole inside
// one of its buffers.
package p2p

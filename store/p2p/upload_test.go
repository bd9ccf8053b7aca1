package p2p

import (
	"sync"
	"testing"
)

// TestSeedUploadUnderTwice is the P2P store's promise: a seed and four
// peers share a 256 MiB object and the seed uploads less than two copies
// of it. The first peer can only read from the seed; the other three then
// fetch together and, preferring replica holders, read from the first.
func TestSeedUploadUnderTwice(t *testing.T) {
	const size = 256 << 20
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	data := newBuffers(t, 96<<20, 160<<20)
	data.fill(7)
	if err := seed.Register(ctx, "ckpt/model", data.addrs, data.sizes, 16<<20, "", false); err != nil {
		t.Fatal(err)
	}
	peers := make([]*node, 4)
	got := make([]*buffers, 4)
	for i := range peers {
		peers[i] = newNode(t, etcd, nil)
		got[i] = newBuffers(t, size)
	}
	if err := peers[0].GetReplica(ctx, "ckpt/model", got[0].addrs, got[0].sizes); err != nil {
		t.Fatalf("peer 0: %v", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(peers))
	for i := 1; i < len(peers); i++ {
		wg.Go(func() { errs[i] = peers[i].GetReplica(ctx, "ckpt/model", got[i].addrs, got[i].sizes) })
	}
	wg.Wait()
	for i := range peers {
		if errs[i] != nil {
			t.Fatalf("peer %d: %v", i, errs[i])
		}
		if !got[i].equal(data) {
			t.Fatalf("peer %d: bytes differ from the seed's", i)
		}
	}
	// Every peer is now a source of every shard.
	for s, sh := range seed.record(t, "ckpt/model").p.Shards {
		if len(sh.ReplicaList) != len(peers) {
			t.Errorf("shard %d: %d replicas, want %d", s, len(sh.ReplicaList), len(peers))
		}
	}
	// A server counts bytes once sent; they are all counted once its
	// engine has closed.
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	up := seed.served(t)
	t.Logf("seed uploaded %d MiB for 4 peers of a %d MiB object; peer 0 uploaded %d MiB",
		up>>20, size>>20, peers[0].served(t)>>20)
	if up >= 2*size {
		t.Fatalf("seed uploaded %d bytes, want under %d (2x the object)", up, 2*size)
	}
}

package p2p

import (
	"fmt"
	"sync"
	"testing"
)

// TestSeedUploadUnderTwice is the P2P store's promise: a seed and four
// peers share a 256 MiB object and the seed uploads less than two copies
// of it, whether the peers start together or one after another.
func TestSeedUploadUnderTwice(t *testing.T) {
	const size = 256 << 20
	cases := []struct {
		name  string
		first int // peers that fetch alone, one after another, before the rest start together
	}{
		// Four peers at once: none has anything at first, so each asks the
		// seed for shards of its own order and takes the others' from the
		// peers that published them.
		{"together", 0},
		// One peer first, then three at once reading from it.
		{"one then three", 1},
	}
	etcd := startEtcd(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			seed := newNode(t, etcd, nil)
			data := newBuffers(t, 96<<20, 160<<20)
			data.fill(7)
			obj := "ckpt/" + tc.name
			if err := seed.Register(ctx, obj, data.addrs, data.sizes, 16<<20, "", false); err != nil {
				t.Fatal(err)
			}
			peers := make([]*node, 4)
			got := make([]*buffers, 4)
			errs := make([]error, 4)
			for i := range peers {
				peers[i] = newNode(t, etcd, nil)
				got[i] = newBuffers(t, size)
			}
			fetch := func(i int) { errs[i] = peers[i].GetReplica(ctx, obj, got[i].addrs, got[i].sizes) }
			for i := range tc.first {
				fetch(i)
			}
			var wg sync.WaitGroup
			for i := tc.first; i < len(peers); i++ {
				wg.Go(func() { fetch(i) })
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
			for s, sh := range seed.record(t, obj).p.Shards {
				if len(sh.ReplicaList) != len(peers) {
					t.Errorf("shard %d: %d replicas, want %d", s, len(sh.ReplicaList), len(peers))
				}
			}
			// A server counts bytes once sent; they are all counted once
			// its engine has closed.
			for _, n := range append(peers, seed) {
				if err := n.Close(); err != nil {
					t.Fatal(err)
				}
			}
			up := seed.served(t)
			var peersUp string
			for i, p := range peers {
				peersUp += fmt.Sprintf(" %d:%d", i, p.served(t)>>20)
			}
			t.Logf("seed uploaded %d MiB (%.2fx) for 4 peers of a %d MiB object; peers uploaded (MiB)%s",
				up>>20, float64(up)/size, size>>20, peersUp)
			if up >= 2*size {
				t.Fatalf("seed uploaded %d bytes, want under %d (2x the object)", up, 2*size)
			}
		})
	}
}

package p2p

import (
	"fmt"
	"testing"
)

// BenchmarkLoneReceiver fetches an object from one seed into one receiver
// nobody fetches beside: the cost of the swarm's bookkeeping (claims,
// announcements, publications) over the reads themselves, which many small
// shards bring out.
func BenchmarkLoneReceiver(b *testing.B) {
	for _, c := range []struct{ n, shard int }{{512, 4 << 10}, {32, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", c.n, c.shard>>10), func(b *testing.B) {
			etcd := startEtcd(b)
			ctx := testCtx(b)
			seed := newNode(b, etcd, nil)
			data := newBuffers(b, uint64(c.n*c.shard))
			data.fill(9)
			if err := seed.Register(ctx, "obj", data.addrs, data.sizes, uint64(c.shard), "", false); err != nil {
				b.Fatal(err)
			}
			r := newNode(b, etcd, nil)
			got := newBuffers(b, uint64(c.n*c.shard))
			b.SetBytes(int64(c.n * c.shard))
			for b.Loop() {
				if err := r.GetReplica(ctx, "obj", got.addrs, got.sizes); err != nil {
					b.Fatal(err)
				}
				if err := r.DeleteReplica(ctx, "obj"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package p2p

import (
	"sync"
	"testing"
)

// TestReregisterInPlaceRestartsFetch: a seed re-registers an object
// (forceCreate) at the same addresses with new bytes while a receiver
// fetches it and the receiver's replica keeps the old record alive. The
// forced Register must make a new version (a new create revision), so
// the receiver starts over rather than ending with shards of both.
func TestReregisterInPlaceRestartsFetch(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	const n, shard = 4, 256 << 10
	data := newBuffers(t, n*shard)
	data.fill(1)
	old := newBuffers(t, n*shard)
	copy(old.bufs[0], data.bufs[0])
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, shard, "", false); err != nil {
		t.Fatal(err)
	}
	r := newNode(t, etcd, func(c *Config) { c.Concurrency = 1 })
	published := make(chan struct{})
	var pubOnce, swapOnce sync.Once
	r.afterPublish = func([]int) { pubOnce.Do(func() { close(published) }) }
	var swapErr error
	r.afterShard = func(int) {
		swapOnce.Do(func() {
			<-published // the receiver's replica keeps the key alive
			if swapErr = seed.Unregister(ctx, "obj"); swapErr != nil {
				return
			}
			data.fill(2) // version 2, same buffer
			swapErr = seed.Register(ctx, "obj", data.addrs, data.sizes, shard, "", true)
		})
	}
	got := newBuffers(t, n*shard)
	err := r.GetReplica(ctx, "obj", got.addrs, got.sizes)
	if swapErr != nil {
		t.Fatalf("re-register: %v", swapErr)
	}
	if err != nil {
		t.Fatalf("GetReplica across a re-register: %v", err)
	}
	if !got.equal(data) {
		t.Fatal("GetReplica succeeded with bytes that are not the new version's (shards of both)")
	}
}

// TestLostClaimLeaseIsRenewed: a receiver's claim lease ends under it (an
// etcd outage or a stall longer than claimTTL); etcd is fine again. The
// pass takes a new lease and goes on: its next seed claim must not fail
// with "lease not found" while the seed and etcd are healthy.
func TestLostClaimLeaseIsRenewed(t *testing.T) {
	etcd := startEtcd(t)
	ctx := testCtx(t)
	seed := newNode(t, etcd, nil)
	const n, shard = 8, 256 << 10
	data := newBuffers(t, n*shard)
	data.fill(3)
	if err := seed.Register(ctx, "obj", data.addrs, data.sizes, shard, "", false); err != nil {
		t.Fatal(err)
	}
	r := newNode(t, etcd, func(c *Config) { c.Concurrency = 1 })
	var once sync.Once
	var revokeErr error
	r.afterShard = func(int) {
		once.Do(func() {
			// As if it expired: every lease in etcd is this pass's.
			leases, err := seed.meta.cli.Leases(ctx)
			if err != nil {
				revokeErr = err
				return
			}
			for _, l := range leases.Leases {
				if _, err := seed.meta.cli.Revoke(ctx, l.ID); err != nil {
					revokeErr = err
				}
			}
		})
	}
	got := newBuffers(t, n*shard)
	err := r.GetReplica(ctx, "obj", got.addrs, got.sizes)
	if revokeErr != nil {
		t.Fatalf("revoke: %v", revokeErr)
	}
	if err != nil {
		t.Fatalf("GetReplica after its claim lease ended: %v", err)
	}
	if !got.equal(data) {
		t.Fatal("bytes differ from the seed's")
	}
}

package p2p_test

import (
	"context"
	"log"

	"github.com/mooncake-go/mooncake/store/p2p"
)

// A seed publishes a checkpoint; any number of nodes fetch it, each
// becoming a source for the next.
func Example() {
	ctx := context.Background()
	s, err := p2p.New(ctx, p2p.Config{Metadata: "etcd://127.0.0.1:2379"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	// On the seed: memory the engine can serve, filled with the bytes.
	buf, err := s.Engine().AllocateBuffer(context.Background(), 64<<20, "cpu:0")
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Free()
	err = s.Register(ctx, "ckpt/layer0", []uintptr{buf.Addr()}, []uint64{uint64(buf.Len())}, 16<<20, "cpu:0", false)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Unregister(ctx, "ckpt/layer0")

	// On every other node (another Store, another host): buffers of the
	// same total size receive it.
	//
	//	err = s.GetReplica(ctx, "ckpt/layer0", addrs, sizes)
	//	...
	//	s.DeleteReplica(ctx, "ckpt/layer0")
	infos, err := s.List(ctx, "ckpt/")
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range infos {
		log.Printf("%s: %d bytes in shards of %d", in.Name, in.TotalSize, in.MaxShardSize)
	}
}

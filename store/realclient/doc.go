// Package realclient splits a store client in two, as Mooncake's
// mooncake_client and setup_dummy do: one real client per host owns a
// segment (the memory it contributes to the pool) and the transfer engine,
// and any number of dummy clients on that host (say, the tensor-parallel
// ranks of one inference server) forward their calls to it, so that they
// share one pool and one engine instead of each mounting its own.
//
// Lifecycle. The real client (`mooncake client`) starts a store client
// and a Server on a unix socket (by default the abstract name
// "@mooncake_client.50052", the official real client's port). A Dummy
// dials it and says how much memory it wants: a pool, from which Alloc
// hands out buffers (setup_dummy's mem_pool_size, alloc_from_mem_pool),
// and a staging buffer (local_buffer_size). The real client creates that
// memory as one memfd, registers it with its store, and passes the fd back
// over the socket (SCM_RIGHTS); both map it.
//
// A dummy may also share memory of its own: RegisterShared sends the fd
// of a memfd mapping (MooncakeHostMemAllocator's host pool, which SGLang
// allocates before setup_dummy) and the real client maps the same pages.
//
// From then on every call is one request frame and one response frame
// (see proto.go). No frame carries a value: a put or get names bytes of
// shared memory by region and offset, and the real client's store reads
// or writes them there. A buffer from Alloc or a registered region thus
// moves without any copy in the dummy; any other buffer is copied once
// into staging (put) or out of it (get).
//
// Failure. When the dummy hangs up, or dies, the real client's read ends,
// and it unregisters and unmaps that dummy's memory once the call in
// progress is done; objects the dummy put stay in the pool. When the real
// client dies, the dummy's call in progress and every later one fail at
// once with an error that wraps ErrGone; a real client that stops
// answering fails calls at their context's deadline, or after
// DefaultCallTimeout.
//
//	srv, _ := realclient.Listen(realclient.Config{Store: storeClient})
//	defer srv.Close()
//	// in each rank's process:
//	d, _ := realclient.Dial(ctx, "127.0.0.1:50052", 1<<30, 64<<20)
//	buf, _ := d.Alloc(4096)
//	copy(buf, page)
//	errs := d.BatchPut(ctx, []string{"k"}, [][]byte{buf}, nil, false) // no copy
package realclient

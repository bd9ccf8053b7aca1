"""The names of the official mooncake-transfer-engine 0.3.13.post1
``mooncake.engine`` and ``mooncake.store`` modules that this package does
not serve, each with the reason. python/tests/test_api_surface.py checks
our modules against the official wheel and accepts exactly these gaps; the
compatibility notes in python/README.md refer here.

Keys are "module.Name" or "module.Class.member"; values are the reason.
"""

_RPC = "coro-RPC tensor/data messaging between processes is not built in mooncake-go"
_POOL = "client-side registered-buffer pools are not built (register_buffer a buffer of your own)"
_TASKS = "master-driven replica copy/move tasks are not built"
_MOUNT = "segments are mounted by the client at setup (mooncake up / Store), not one by one from Python"
_PUT_SESSION = "put sessions (reserve, write ranges, seal) are not built: puts are whole (put_from, parts)"
_PARALLEL = "ParallelAxis/ReadTarget tensor layouts are not built (the _with_tp forms are)"
_GPU = "GPU memory: needs a CUDA build (mooncake-go moves host memory only)"

EXCEPTIONS = {
    # mooncake.engine
    "mooncake.engine.CoroRPCInterface": _RPC,
    "mooncake.engine.RpcInterface": _RPC,
    "mooncake.engine.ReceivedData": _RPC,
    "mooncake.engine.ReceivedTensor": _RPC,
    "mooncake.engine.create_rpc_client": _RPC,
    "mooncake.engine.create_rpc_server": _RPC,
    "mooncake.engine.InnerTransferEngine": "the C++ engine object get_engine() returns; ours is mooncake_go.TransferEngine",
    "mooncake.engine.SharedSegment": _GPU + " (NVLink/IPC shared device segment)",
    # mooncake.store: types
    "mooncake.store.BufferLease": _POOL,
    "mooncake.store.BufferLeaseView": _POOL,
    "mooncake.store.BufferPool": _POOL,
    "mooncake.store.RegisteredBufferLease": _POOL,
    "mooncake.store.RegisteredBufferLeaseView": _POOL,
    "mooncake.store.RegisteredBufferPool": _POOL,
    "mooncake.store.EngramStore": "Engram embedding tables are not built",
    "mooncake.store.EngramStoreConfig": "Engram embedding tables are not built",
    "mooncake.store.MooncakeDistributedNoFRegister": "NVMe-oF segments are not built",
    "mooncake.store.ParallelAxis": _PARALLEL,
    "mooncake.store.ReadTarget": _PARALLEL,
    "mooncake.store.TensorParallelism": _PARALLEL,
    "mooncake.store.QueryTaskResponse": _TASKS,
    "mooncake.store.get_alloc_func_addr": _GPU + " (torch CUDAPluggableAllocator hooks)",
    "mooncake.store.get_free_func_addr": _GPU + " (torch CUDAPluggableAllocator hooks)",
    # mooncake.store.MooncakeDistributedStore methods
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _MOUNT for m in (
        "allocate_and_mount_segment", "mount_segment", "unmount_segment", "unmount_and_free_segment",
        "unmount_local_disk_segment")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _TASKS for m in (
        "create_copy_task", "create_move_task", "query_task", "batch_replica_clear")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _PUT_SESSION for m in (
        "batch_put_session_start", "batch_put_session_end", "batch_put_session_revoke",
        "batch_put_from_multi_buffer_ranges")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _PARALLEL for m in (
        "put_tensor_with_parallelism", "put_tensor_with_parallelism_from", "upsert_tensor_with_parallelism",
        "upsert_tensor_with_parallelism_from", "batch_put_tensor_with_parallelism",
        "batch_put_tensor_with_parallelism_from", "batch_upsert_tensor_with_parallelism",
        "batch_upsert_tensor_with_parallelism_from", "get_tensor_with_parallelism",
        "get_tensor_with_parallelism_into", "batch_get_tensor_with_parallelism",
        "batch_get_tensor_with_parallelism_into")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _GPU for m in (
        "get_tensor_into_cuda", "batch_get_tensor_into_cuda")},
    "mooncake.store.MooncakeDistributedStore.put_tensor_with_tp_from":
        "splitting a tensor laid out in a raw buffer is not built (put_tensor_with_tp splits a tensor)",
    "mooncake.store.MooncakeDistributedStore.batch_put_tensor_with_tp_from":
        "splitting a tensor laid out in a raw buffer is not built (batch_put_tensor_with_tp splits tensors)",
    "mooncake.store.MooncakeDistributedStore.load_tensor_from_safetensor": "safetensors import is not built",
    "mooncake.store.MooncakeDistributedStore.save_tensor_to_safetensor": "safetensors export is not built",
}

"""The names of the official mooncake-transfer-engine 0.3.13.post1
``mooncake.engine`` and ``mooncake.store`` modules that this package does
not serve, each with the reason. python/tests/test_api_surface.py checks
our modules against the official wheel and accepts exactly these gaps; the
compatibility notes in python/README.md refer here.

Keys are "module.Name" or "module.Class.member"; values are the reason.
"""

_RPC = "coro-RPC tensor/data messaging between processes is not built in mooncake-go"
_TASKS = "master-driven replica copy/move tasks are not built"
_MOUNT = "segments are mounted by the client at setup (mooncake up / Store), not one by one from Python"
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
    "mooncake.store.EngramStore": "Engram embedding tables are not built",
    "mooncake.store.EngramStoreConfig": "Engram embedding tables are not built",
    "mooncake.store.MooncakeDistributedNoFRegister": "NVMe-oF segments are not built",
    "mooncake.store.QueryTaskResponse": _TASKS,
    "mooncake.store.get_alloc_func_addr": _GPU + " (torch CUDAPluggableAllocator hooks)",
    "mooncake.store.get_free_func_addr": _GPU + " (torch CUDAPluggableAllocator hooks)",
    # mooncake.store.MooncakeDistributedStore methods
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _MOUNT for m in (
        "allocate_and_mount_segment", "mount_segment", "unmount_segment", "unmount_and_free_segment",
        "unmount_local_disk_segment")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _TASKS for m in (
        "create_copy_task", "create_move_task", "query_task", "batch_replica_clear")},
    **{f"mooncake.store.MooncakeDistributedStore.{m}": _GPU for m in (
        "get_tensor_into_cuda", "batch_get_tensor_into_cuda")},
}

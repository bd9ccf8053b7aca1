"""The serving side of the mooncake_te transfer channel test, in a process of
its own (test_transfer_channel.py starts it with the suite's python).

    python tc_peer.py LISTEN_URL SIZE...

Builds LMCache's L1 memory pool (L1MemoryManager), allocates one object per
SIZE filled with random bytes (object i: random.Random(i).randbytes(SIZE)),
and opens LMCache's "mooncake_te" transfer channel context on the pool, which
registers it with our TransferEngine and serves the channel's handshake on
LISTEN_URL. Prints one JSON line {"pool": bytes, "objects": [[offset, size],
...]} once ready, then serves until its stdin closes.
"""

from __future__ import annotations

import ctypes
import json
import random
import sys

import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc
from lmcache.v1.distributed.config import L1MemoryManagerConfig
from lmcache.v1.distributed.error import L1Error
from lmcache.v1.distributed.memory_manager import L1MemoryManager
from lmcache.v1.distributed.transfer_channel import (delete_transfer_channel_context,
                                                     initialize_transfer_channel_context)

POOL = 4 << 20


def pool() -> L1MemoryManager:
    return L1MemoryManager(L1MemoryManagerConfig(size_in_bytes=POOL, use_lazy=False))


def allocate(mgr: L1MemoryManager, size: int):
    err, objs = mgr.allocate(MemoryLayoutDesc(shapes=[torch.Size([size])], dtypes=[torch.uint8]), 1)
    if err != L1Error.SUCCESS:
        raise RuntimeError(f"L1 allocation of {size} bytes failed: {err}")
    return objs[0]


def main() -> None:
    url, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
    mgr = pool()
    base = mgr.get_l1_memory_desc().ptr
    objs = [allocate(mgr, n) for n in sizes]
    for i, (obj, n) in enumerate(zip(objs, sizes)):
        ctypes.memmove(base + obj.shm_offset, random.Random(i).randbytes(n), n)
    initialize_transfer_channel_context("mooncake_te", l1_memory_desc=mgr.get_l1_memory_desc(),
                                        listen_url=url, advertise_url=url)
    try:
        print(json.dumps({"pool": mgr.get_l1_memory_desc().size,
                          "objects": [[o.shm_offset, n] for o, n in zip(objs, sizes)]}), flush=True)
        sys.stdin.read()
    finally:
        delete_transfer_channel_context()
        mgr.free(objs)
        mgr.close()


if __name__ == "__main__":
    main()

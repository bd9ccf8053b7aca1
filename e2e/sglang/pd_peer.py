"""The decode side of test_sglang_pd.py, a process of its own: SGLang's PD
transfer wrapper (MooncakeTransferEngine, as the decode's MooncakeKVManager
makes it) with one zeroed KV buffer registered the way the manager registers
its buffers (batch_register). Prints {"session_id", "ptr", "size", "rc"} as
one JSON line, then answers commands on stdin: "dump" prints the buffer as
hex, "quit" (or end of input) exits."""

import ctypes
import json
import sys

from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine


def main() -> None:
    size = int(sys.argv[1])
    engine = MooncakeTransferEngine(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    buf = (ctypes.c_ubyte * size)()
    ptr = ctypes.addressof(buf)
    rc = engine.batch_register([ptr], [size])
    print(json.dumps({"session_id": engine.get_session_id(), "ptr": ptr, "size": size, "rc": rc}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "dump":
            print(bytes(buf).hex(), flush=True)
        elif cmd == "quit":
            break
    engine.batch_deregister([ptr])


if __name__ == "__main__":
    main()

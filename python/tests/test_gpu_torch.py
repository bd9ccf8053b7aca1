"""The library with real CUDA tensors: torch on a GPU host.

CI has no GPU, so these are skipped there; the CUDA driver test double
(test_device_store.py, engine/device/fakecuda) covers the same paths in
`make test`. scripts/gpu-check.sh runs this file on a GPU host.

What a real GPU adds to the double: its copies are asynchronous. A driver
copy into device memory from device memory, or from pageable host memory,
may return before the bytes land (CUDA's documented synchronisation
rules), and torch's streams are not ordered after the driver's legacy
stream. So every check here reads the result on a fresh torch stream right
after the call returns, without synchronising the device first: a library
that reported a transfer complete before its copy had landed can fail
them. On an H200, before the engine synchronised its copies,
test_engine_own_segment_device_to_device failed so (its read); the
unfenced control of the vLLM save shows the same race from the other side.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import mooncake_go as mg  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIG = 1 << 30  # a device-to-device copy this large takes ~1 ms on a recent GPU


def pattern(n: int, seed: int) -> "torch.Tensor":
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((i * 131 + seed * 7 + (i >> 9)) & 0xFF).to(torch.uint8)


def equal_now(a, b) -> bool:
    """a == b as a fresh stream sees it now: nothing waits for copies still
    in flight on other streams."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        return bool(torch.equal(a, b))


def key(what: str) -> str:
    return f"gpu-{what}-{uuid.uuid4().hex}"


def busy(ms: float = 50) -> None:
    """Queues about ms of work on the current stream."""
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    a @ a
    t1.record()
    t1.synchronize()
    for _ in range(max(1, int(ms / max(t0.elapsed_time(t1), 0.01)))):
        a @ a


def test_copy_every_way():
    n = 64 << 20
    g, h = pattern(n, 2), torch.zeros(n, dtype=torch.uint8)
    mg.copy(h, g)
    assert torch.equal(h, g.cpu())
    g2 = torch.zeros(n, dtype=torch.uint8, device="cuda")
    mg.copy(g2, h)
    assert equal_now(g2, g)
    g3 = torch.zeros(BIG, dtype=torch.uint8, device="cuda")
    big = pattern(BIG, 3)
    torch.cuda.synchronize()
    mg.copy(g3, big)
    assert equal_now(g3, big), "mooncake_go.copy returned before the device copy landed"


def test_engine_own_segment_device_to_device():
    with mg.TransferEngine(host="127.0.0.1") as e:
        a, b = pattern(BIG, 4), torch.zeros(BIG, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        e.register_memory(a)
        e.register_memory(b)
        e.write(e.name, a, b.data_ptr())
        assert equal_now(a, b), "the engine reported a local device copy complete before it landed"
        c = torch.zeros(BIG, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        e.register_memory(c)
        e.read(e.name, c, a.data_ptr())
        assert equal_now(a, c)
        for t in (a, b, c):
            e.unregister_memory(t)


PEER = textwrap.dedent("""
    import json, sys, torch, mooncake_go as mg
    transport, n = sys.argv[1], int(sys.argv[2])
    def pattern(n, seed):
        i = torch.arange(n, dtype=torch.int64, device="cuda")
        return ((i * 131 + seed * 7 + (i >> 9)) & 0xFF).to(torch.uint8)
    e = mg.TransferEngine(host="127.0.0.1", transport=transport or None)
    buf = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    e.register_memory(buf)
    print(json.dumps({"name": e.name, "addr": buf.data_ptr()}), flush=True)
    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd == "check":  # on a fresh stream, without waiting for the device
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                print(int(torch.equal(buf, pattern(n, int(arg)))), flush=True)
        elif cmd == "fill":
            buf.copy_(pattern(n, int(arg)))
            torch.cuda.synchronize()
            print("ok", flush=True)
        else:
            break
    e.unregister_memory(buf)
    e.close()
""")


@pytest.mark.parametrize("transport,n", [("", BIG), ("tcp", 64 << 20)], ids=["default-ipc", "tcp"])
def test_engine_between_processes(transport, n):
    """GPU to GPU across processes: CUDA IPC by default, staged through
    page-locked memory over TCP with transport=tcp. The peer reads what
    was written as soon as the write returns."""
    p = subprocess.Popen([sys.executable, "-c", PEER, transport, str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)

    def ask(cmd: str) -> str:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    try:
        info = json.loads(p.stdout.readline())
        with mg.TransferEngine(host="127.0.0.1", transport=transport or None) as e:
            src, dst = pattern(n, 5), torch.zeros(n, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            e.register_memory(src)
            e.register_memory(dst)
            want = pattern(n, 6)
            torch.cuda.synchronize()
            e.write(info["name"], src, info["addr"])
            assert ask("check 5") == "1", "the peer's GPU did not hold the bytes when the write returned"
            assert ask("fill 6") == "ok"
            e.read(info["name"], dst, info["addr"])
            assert equal_now(dst, want), "the read returned before the bytes landed"
            e.unregister_memory(src)
            e.unregister_memory(dst)
        ask("bye 0")
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_store_with_cuda_tensors(master):
    n = 24 << 20
    with mg.Store(master, segment_size=128 << 20, local_buffer_size=32 << 20, local_hostname="127.0.0.1") as s:
        src, dst = pattern(n, 7), torch.zeros(n, dtype=torch.uint8, device="cuda")
        loose = torch.zeros(n, dtype=torch.uint8, device="cuda")  # never registered
        torch.cuda.synchronize()
        s.register_buffer(src)
        s.register_buffer(dst)
        k = key("one")
        s.put_from(k, src)
        assert s.get(k) == src.cpu().numpy().tobytes()
        assert s.get_into(k, dst) == n
        assert equal_now(dst, src)
        assert s.get_into(k, loose) == n
        assert equal_now(loose, src)

        half = n // 2
        keys = [key("b0"), key("b1")]
        assert s.batch_put_from(keys, [src[:half], src[half:]]) == [None, None]
        dst.zero_()
        torch.cuda.synchronize()
        assert list(s.batch_get_into(keys, [dst[:half], dst[half:]])) == [half, n - half]
        assert equal_now(dst, src)

        kp = key("parts")
        assert s.batch_put_from_parts([kp], [[src[:1000], src[1000:half], src[half:]]]) == [None]
        dst.zero_()
        torch.cuda.synchronize()
        assert list(s.batch_get_into_parts([kp], [[dst[:7], dst[7:]]])) == [n]
        assert equal_now(dst, src)
        s.unregister_buffer(src)
        s.unregister_buffer(dst)


def _layout_module():
    spec = importlib.util.spec_from_file_location("mc_vllm_layout", ROOT / "connectors/vllm/layout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced-control"])
def test_vllm_save_waits_for_the_forward_pass(master, fenced):
    """The vLLM connector's saves: vLLM calls wait_for_save once it has
    queued the forward pass on its stream. A save fenced by compute_fence
    stores what the pass wrote; the unfenced control shows that without the
    fence the store reads the blocks too early."""
    layout = _layout_module()
    nb = 16
    kv = {f"l{i}": torch.zeros(2, nb, 16, 8, 128, dtype=torch.float16, device="cuda") for i in range(2)}
    torch.cuda.synchronize()
    lay = layout.Layout(kv, nb)
    with mg.Store(master, segment_size=64 << 20, local_buffer_size=16 << 20, local_hostname="127.0.0.1") as s:
        for addr, n in lay.regions:
            s.register_buffer(addr, n)
        side = torch.cuda.Stream()  # vLLM's forward pass may run on a stream of its own
        with torch.cuda.stream(side):
            busy()
            for t in kv.values():
                t[:, 3].fill_(1.5)
            fence = layout.compute_fence(lay)
        assert fence is not None
        if fenced:
            fence.synchronize()
        k = key("block")
        addrs, lens = lay.parts(3)
        assert s.batch_put_from_parts([k], [addrs], [lens]) == [None]
        torch.cuda.synchronize()
        want = b"".join(t[i, 3].contiguous().cpu().numpy().tobytes() for t in kv.values() for i in range(2))
        got = s.get(k)
        if fenced:
            assert got == want
        else:
            assert got != want, "the unfenced save read the finished blocks: the control shows nothing"
        for addr, _ in lay.regions:
            s.unregister_buffer(addr)

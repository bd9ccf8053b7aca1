"""The store with GPU buffers, as vLLM's MooncakeStoreConnector passes them
on a GPU host: CUDA tensors (``data_ptr()``) through mooncake_go, device
pointers through the compat ``MooncakeDistributedStore``'s batch_put_from
/ batch_get_into and their multi-buffer forms.

The GPU is the CUDA driver test double (engine/device/fakecuda), loaded
with ctypes as a framework loads libcuda; the library finds device
pointers by asking it. The CPU cannot touch the double's device memory
(any access faults), so a library that copied such a buffer itself would
kill the process. Each check therefore runs in a child process of its own
(this file run as a script), which also keeps the double's armed failures
away from the rest of the session. MC_CUDA_DRIVER names the double
(scripts/test-python.sh builds it); without it the fixture builds one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> str:
    path = os.environ.get("MC_CUDA_DRIVER")
    if path:
        return path
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler (gcc) to build the CUDA driver test double")
    out = tmp_path_factory.mktemp("fakecuda")
    subprocess.run(["bash", str(ROOT / "engine/device/fakecuda/build.sh"), str(out)], check=True)
    return str(out / "libfakecuda.so")


def run_child(master: str, driver: str, mode: str) -> None:
    env = dict(os.environ, MC_CUDA_DRIVER=driver)
    r = subprocess.run([sys.executable, str(Path(__file__)), mode, master], cwd=HERE, env=env,
                       capture_output=True, text=True, timeout=300)
    # A Go crash prints its cause first and every goroutine after it.
    err = r.stderr if len(r.stderr) < 6000 else r.stderr[:4000] + "\n...\n" + r.stderr[-2000:]
    assert r.returncode == 0, f"{mode} child exited {r.returncode}\n{r.stdout}\n{err}"
    assert "ok" in r.stdout.split(), r.stdout


def test_native_store_with_cuda_tensors(master, fake_driver):
    run_child(master, fake_driver, "native")


def test_compat_store_with_device_pointers(master, fake_driver):
    run_child(master, fake_driver, "compat")


# -- the child ---------------------------------------------------------------


class Cuda:
    """The few driver entry points a framework would call, on GPU 0."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuInit(0), "cuInit")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.lib.cuMemcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.fakecuda_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]

    @staticmethod
    def check(rc: int, call: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{call}: CUDA error {rc}")

    def alloc(self, n: int) -> int:
        p = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc_v2")
        return p.value

    def upload(self, dst: int, data: bytes) -> None:
        buf = ctypes.create_string_buffer(data, len(data))
        self.check(self.lib.cuMemcpy(dst, ctypes.addressof(buf), len(data)), "cuMemcpy")

    def download(self, src: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        self.check(self.lib.cuMemcpy(ctypes.addressof(buf), src, n), "cuMemcpy")
        return buf.raw

    def fail_next_copy(self) -> None:
        self.lib.fakecuda_fail(b"cuMemcpy", 1, 0)

    def reset(self) -> None:
        self.lib.fakecuda_reset()


class CudaTensor:
    """The part of a torch CUDA tensor of bytes the package uses."""

    class device:
        type = "cuda"
        index = 0

    def __init__(self, ptr: int, n: int):
        self.ptr, self.n = ptr, n

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 1

    def is_contiguous(self) -> bool:
        return True

    def __getitem__(self, s: slice) -> "CudaTensor":
        start, stop, _ = s.indices(self.n)
        return CudaTensor(self.ptr + start, stop - start)


def value(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed * 7 + (i >> 9)) & 0xFF for i in range(n))


def key(what: str) -> str:
    return f"gpu-{what}-{uuid.uuid4().hex}"


N = (3 << 20) + 5  # more than a staging piece


def child_native(master: str, cuda: Cuda) -> None:
    import mooncake_go as mg
    from mooncake_go import errors

    with mg.Store(master, segment_size=64 << 20, local_buffer_size=16 << 20, local_hostname="127.0.0.1") as s:
        src, dst = CudaTensor(cuda.alloc(N), N), CudaTensor(cuda.alloc(N), N)
        loose = CudaTensor(cuda.alloc(N), N)  # never registered: staged by the driver
        s.register_buffer(src)
        s.register_buffer(dst)

        want = value(N, 1)
        cuda.upload(src.ptr, want)
        k = key("one")
        s.put_from(k, src)
        assert s.get_into(k, dst) == N
        assert cuda.download(dst.ptr, N) == want
        assert s.get(k) == want  # host bytes: the checksum taken by the transfer holds
        assert s.get_into(k, loose) == N
        assert cuda.download(loose.ptr, N) == want
        # upsert from device memory nobody registered
        nxt = value(N, 2)
        cuda.upload(loose.ptr, nxt)
        s.upsert_from(k, loose)
        assert s.get(k) == nxt

        # mooncake_go.copy between host and device memory, every way
        h = bytearray(value(4096, 9))
        mg.copy(src.ptr, bytes(h))
        mg.copy(dst.ptr, src.ptr, 4096)
        back = bytearray(4096)
        mg.copy(back, dst.ptr, 4096)
        assert bytes(back) == bytes(h)

        # batches and parts (one per layer) in device memory
        want = value(N, 3)
        cuda.upload(src.ptr, want)
        half = N // 2
        keys = [key("b0"), key("b1")]
        assert s.batch_put_from(keys, [src[:half], src[half:]]) == [None, None]
        got = s.batch_get_into(keys, [dst[:half], dst[half:]])
        assert list(got) == [half, N - half], got
        assert cuda.download(dst.ptr, N) == want
        kp = key("parts")
        layers = [src[:1000], src[1000:half], src[half:]]
        assert s.batch_put_from_parts([kp], [layers]) == [None]
        assert s.get(kp) == want
        cuda.upload(dst.ptr, bytes(N))
        assert list(s.batch_get_into_parts([kp], [[dst[:7], dst[7:]]])) == [N]
        assert cuda.download(dst.ptr, N) == want

        # a driver copy failing mid-put fails it; the key stays unreadable
        kf = key("fail")
        cuda.reset()
        cuda.fail_next_copy()
        try:
            s.put_from(kf, src)
        except errors.MooncakeError:
            pass
        else:
            raise AssertionError("put_from with a failing driver copy succeeded")
        assert not s.exists(kf)
        cuda.reset()
        s.put_from(kf, src)
        cuda.fail_next_copy()
        try:
            s.get_into(kf, dst)
        except errors.MooncakeError:
            pass
        else:
            raise AssertionError("get_into with a failing driver copy succeeded")
        cuda.reset()
        assert s.get_into(kf, dst) == N
        assert cuda.download(dst.ptr, N) == want


def child_compat(master: str, cuda: Cuda) -> None:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", master) == 0
    try:
        src, dst = cuda.alloc(N), cuda.alloc(N)
        assert s.register_buffer(src, N) == 0
        assert s.register_buffer(dst, N) == 0
        want = value(N, 4)
        cuda.upload(src, want)
        half = N // 2
        keys = [key("c0"), key("c1")]
        assert s.batch_put_from(keys, [src, src + half], [half, N - half]) == [0, 0]
        assert s.batch_get_into(keys, [dst, dst + half], [half, N - half]) == [half, N - half]
        assert cuda.download(dst, N) == want
        assert s.get(keys[1]) == want[half:]

        km = key("multi")
        assert s.batch_put_from_multi_buffers([km], [[src, src + 4096]], [[4096, N - 4096]]) == [0]
        cuda.upload(dst, bytes(N))
        assert s.batch_get_into_multi_buffers([km], [[dst, dst + 10]], [[10, N - 10]]) == [N]
        assert cuda.download(dst, N) == want
        assert s.put_from(key("one"), src, N) == 0

        # a failing driver copy: a negative code, never success
        cuda.fail_next_copy()
        kf = key("fail")
        assert s.batch_put_from([kf], [src], [N])[0] < 0
        assert s.is_exist(kf) == 0
        cuda.reset()
        assert s.unregister_buffer(src) == 0
        assert s.unregister_buffer(dst) == 0
    finally:
        s.close()


if __name__ == "__main__":
    mode, master_addr = sys.argv[1], sys.argv[2]
    driver = Cuda(os.environ["MC_CUDA_DRIVER"])
    {"native": child_native, "compat": child_compat}[mode](master_addr, driver)
    print("ok")

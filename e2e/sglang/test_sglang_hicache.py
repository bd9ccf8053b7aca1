"""SGLang's HiCache storage backend ``MooncakeStore`` built the way SGLang's
cache controller builds it when attaching ``--hicache-storage-backend
mooncake``: the ``--hicache-storage-backend-extra-config`` JSON parsed by
SGLang's own parser, a HiCacheStorageConfig carrying it, the backend made by
StorageBackendFactory over a real host KV pool (MHATokenToKVPoolHost or
MLATokenToKVPoolHost over a CPU device pool), then register_mem_pool_host.
Pages go out with batch_set_v1 and come back with batch_get_v1 into other
pages of the same pool; every test compares the bytes, and reads the objects
SGLang wrote with a plain client to pin down their keys.

Harness-only choice: the host pools get pin_memory=False. With True SGLang
calls cudaHostRegister, which needs a GPU; nothing else differs."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
import uuid

import pytest
import torch
from mooncake.store import MooncakeDistributedStore

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeHostTensorAllocator

PAGE = 4  # tokens per page
SEGMENT = 64 << 20  # each backend's own segment: plain bytes (SGLang parses only "gb" suffixes)
LAYERS = 2


def mha_host_pool(allocator_type: str = "default") -> MHATokenToKVPoolHost:
    """A page_first MHA host pool (2 layers, 2 KV heads of 64, bf16): the
    layout whose pages go to the store as one K and one V object."""
    dev = MHATokenToKVPool(128, PAGE, torch.bfloat16, 2, 64, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    return MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, "page_first",
                                pin_memory=False, device="cpu", allocator_type=allocator_type,
                                device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                end_layer=dev.end_layer, write_back_staging=dev.hicache_write_back_staging)


def mla_host_pool() -> MLATokenToKVPoolHost:
    """A layer_first MLA host pool (3 layers, kv_lora_rank 64 + rope 16): a
    page is one object spread over one buffer per layer, so SGLang puts and
    gets it with the multi-buffer calls."""
    dev = MLATokenToKVPool(128, PAGE, torch.bfloat16, 64, 16, 3, "cpu", False, start_layer=0, end_layer=3)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, "layer_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=3, target_layer_num=3)


def attach(extra_config_json: str, host, tp_rank: int = 0, tp_size: int = 1, model_name=None):
    """The backend as the cache controller attaches it."""
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(extra_config_json)
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=isinstance(host, MLATokenToKVPoolHost), enable_storage_metrics=False,
        is_page_first_layout=host.layout == "page_first", model_name=model_name, extra_config=extra)
    backend = StorageBackendFactory.create_backend("mooncake", cfg, host)
    backend.register_mem_pool_host(host)
    return backend


def tokens(pages) -> torch.Tensor:
    """Host token indices of whole pages, as the controller passes them."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_bytes(host, page: int) -> bytes:
    """The bytes of one page in the host pool, K then V (MHA) or layer by
    layer (MLA), which is how SGLang lays out its objects."""
    # MLA: (layer, token, 1, dim); MHA: (k|v, token, layer, head, dim)
    parts = page_view(host, page).unbind(0)
    return b"".join(p.contiguous().view(torch.uint8).numpy().tobytes() for p in parts)


def page_view(host, page: int) -> torch.Tensor:
    """The page's tokens in the pool (dimension 1 is the token in both layouts)."""
    return host.kv_buffer[:, page * PAGE:(page + 1) * PAGE]


def fill(host, pages, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in pages:
        view = page_view(host, p)
        view.copy_(torch.randn(view.shape, generator=g).to(view.dtype))
    for p in pages:
        assert any(page_bytes(host, p)), "the filled page is zero"


def zero(host, pages) -> None:
    for p in pages:
        page_view(host, p).zero_()


def raw_client(master: str) -> MooncakeDistributedStore:
    """A plain client (no segment of its own) to look at what SGLang stored."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
    return s


def extra_json(master: str, **kw) -> str:
    return json.dumps({"master_server_address": master, "protocol": "tcp", "global_segment_size": SEGMENT,
                       "prefetch_threshold": 256, **kw})


def test_mha_tp_ranks(sglang_environ):
    """Two TP ranks of an MHA model write different KV under the same page
    hashes: each gets its own pages back, the objects are named
    <tag>_<model>_<hash>_<rank>_k|v, and a rank does not see the other's."""
    master = sglang_environ.master
    keys = [f"h{uuid.uuid4().hex}" for _ in range(3)]
    only0 = f"h{uuid.uuid4().hex}"
    conf = extra_json(master, extra_backend_tag="e2e")
    ranks = []
    for rank in (0, 1):
        host = mha_host_pool()
        backend = attach(conf, host, tp_rank=rank, tp_size=2, model_name="org/tiny")
        fill(host, [0, 1, 2, 3], seed=100 + rank)
        ranks.append((backend, host))

    for rank, (backend, host) in enumerate(ranks):
        assert backend.batch_exists(keys) == 0
        assert backend.batch_set_v1(keys, tokens([0, 1, 2])) == [True] * 3
    assert ranks[0][0].batch_set_v1([only0], tokens([3])) == [True]

    raw = raw_client(master)
    for rank, (backend, host) in enumerate(ranks):
        assert backend.batch_exists(keys) == 3
        # Counted up to the first page missing: this rank never wrote only0.
        assert backend.batch_exists(keys[:2] + [only0] + keys[2:]) == (4 if rank == 0 else 2)
        zero(host, [10, 11, 12])
        assert backend.batch_get_v1(keys, tokens([10, 11, 12])) == [True] * 3
        for src, dst in zip([0, 1, 2], [10, 11, 12]):
            assert page_bytes(host, dst) == page_bytes(host, src), f"rank {rank}: page {src} came back different"
        # The objects themselves, as another process sees them.
        kv = page_bytes(host, 0)
        half = len(kv) // 2
        assert raw.get(f"e2e_org-tiny_{keys[0]}_{rank}_k") == kv[:half]
        assert raw.get(f"e2e_org-tiny_{keys[0]}_{rank}_v") == kv[half:]
    # The two ranks' pages differ, so the comparisons above can tell them apart.
    assert page_bytes(ranks[0][1], 0) != page_bytes(ranks[1][1], 0)

    # A page the store does not have is reported missing, not filled.
    backend, host = ranks[1]
    assert backend.batch_get_v1([keys[0], only0], tokens([20, 21])) == [True, False]


def test_mla_multi_buffer_group_semantics(sglang_environ):
    """An MLA pool in layer_first layout: a page is one object gathered from
    one buffer per layer (batch_put_from_multi_buffers /
    batch_get_into_multi_buffers), put with SGLang's group semantics
    (ReplicateConfig.group_ids). MLA objects carry no TP rank, so another
    rank finds what rank 0 wrote."""
    master = sglang_environ.master
    keys = [f"m{uuid.uuid4().hex}" for _ in range(2)]
    conf = extra_json(master, enable_group_semantics=True)
    host0 = mla_host_pool()
    writer = attach(conf, host0, tp_rank=0, tp_size=2)
    # SGLang takes the group path only if our ReplicateConfig has group_ids.
    assert writer._use_group_semantics
    fill(host0, [1, 2], seed=7)
    assert writer.batch_set_v1(keys, tokens([1, 2])) == [True, True]

    host1 = mla_host_pool()
    reader = attach(conf, host1, tp_rank=1, tp_size=2)
    assert reader.batch_exists(keys) == 2
    zero(host1, [5, 6])
    assert reader.batch_get_v1(keys, tokens([5, 6])) == [True, True]
    assert page_bytes(host1, 5) == page_bytes(host0, 1)
    assert page_bytes(host1, 6) == page_bytes(host0, 2)
    assert page_bytes(host1, 5) != page_bytes(host1, 6)
    assert raw_client(master).get(f"{keys[0]}__k") == page_bytes(host0, 1)
    # Missing page: reported, its buffers left as they were.
    assert reader.batch_get_v1([f"m{uuid.uuid4().hex}"], tokens([7])) == [False]
    assert not any(page_bytes(host1, 7))


def test_standalone_storage(sglang_environ, real_client):
    """standalone_storage: the host pool comes from MooncakeHostTensorAllocator
    (mooncake.store.MooncakeHostMemAllocator) and the store is set up with
    setup_dummy, a dummy client of the real client (``mooncake client``) at
    client_server_address, which maps the registered host pool: two TP
    ranks' pages go through it into one pool, where an ordinary client
    finds them."""
    master = sglang_environ.master
    conf = json.dumps({"client_server_address": real_client.address, "standalone_storage": True, "protocol": "tcp"})
    keys = [f"s{uuid.uuid4().hex}" for _ in range(2)]
    for rank in (0, 1):
        host = mha_host_pool(allocator_type="mooncake")
        assert isinstance(host.allocator, MooncakeHostTensorAllocator)
        assert host.kv_buffer.data_ptr() == host.allocator.ptr  # the pool is the allocator's memory
        backend = attach(conf, host, tp_rank=rank, tp_size=2)
        assert backend.store.get_hostname().startswith("dummy@")  # a dummy client
        fill(host, [0, 1], seed=3 + rank)
        assert backend.batch_set_v1(keys, tokens([0, 1])) == [True, True]
        zero(host, [8, 9])
        assert backend.batch_get_v1(keys, tokens([8, 9])) == [True, True]
        assert page_bytes(host, 8) == page_bytes(host, 0)
        assert page_bytes(host, 9) == page_bytes(host, 1)
        kv = page_bytes(host, 1)
        assert raw_client(master).get(f"{keys[1]}_{rank}_v") == kv[len(kv) // 2:]


class _Proxy(http.server.ThreadingHTTPServer):
    """Forwards GETs to the master's admin port and records each answer."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.seen = []  # (status, body) per request
        self.cond = threading.Condition()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.server.target}{self.path}", timeout=5) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        with self.server.cond:
            self.server.seen.append((status, body.decode()))
            self.server.cond.notify_all()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_check_server_waits_for_a_segment(bare_master, monkeypatch):
    """MOONCAKE_CHECK_SERVER=1: SGLang polls http://<master>:<metrics
    port>/get_all_segments until the body is non-empty. Against a master with
    no segment it must keep waiting; once a client mounts one it goes on. A
    proxy in front of our admin port records what each poll got."""
    proxy = _Proxy(bare_master.metrics_port)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for k, v in {"MOONCAKE_MASTER": bare_master.address, "MOONCAKE_PROTOCOL": "tcp",
                 "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(SEGMENT),
                 "MOONCAKE_CHECK_SERVER": "1",
                 "MOONCAKE_MASTER_METRICS_PORT": str(proxy.server_address[1])}.items():
        monkeypatch.setenv(k, v)
    host = mha_host_pool()
    result = {}

    def build():
        try:
            result["backend"] = attach("", host)  # no extra config: SGLang reads the environment
        except BaseException as e:  # reported by the test thread
            result["error"] = e

    t = threading.Thread(target=build, daemon=True)
    try:
        t.start()
        with proxy.cond:  # SGLang polls every 3 s; it stops polling once the check passes
            assert proxy.cond.wait_for(lambda: len(proxy.seen) >= 2 or not t.is_alive(), timeout=30), proxy.seen
            assert all(s == (200, "") for s in proxy.seen), f"answers to SGLang's polls: {proxy.seen}"
            assert t.is_alive() and not result, f"the check passed with no segment mounted: {result}"
        mounter = MooncakeDistributedStore()
        assert mounter.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, 16 << 20, "tcp", "", bare_master.address) == 0
        t.join(60)
        assert not t.is_alive(), "the check did not pass after a segment was mounted"
        assert "error" not in result, result
        status, body = proxy.seen[-1]
        assert status == 200 and body.strip(), proxy.seen
        segments = body.split()
        assert len(segments) >= 1 and all(":" in s for s in segments), body
        # The backend works: one page out and back.
        key = f"c{uuid.uuid4().hex}"
        fill(host, [0], seed=11)
        assert result["backend"].batch_set_v1([key], tokens([0])) == [True]
        assert result["backend"].batch_get_v1([key], tokens([1])) == [True]
        assert page_bytes(host, 1) == page_bytes(host, 0)
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_get_all_segments_lists_the_nodes(cluster):
    """Our admin endpoint as Mooncake's master answers it: 200, one segment
    name per line, the storage node's among them."""
    node = next(line.split("segment=", 1)[1].split()[0] for line in cluster.lines if "segment=" in line)
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/get_all_segments", timeout=5) as r:
        assert r.status == 200
        body = r.read().decode()
    assert node in body.split(), body

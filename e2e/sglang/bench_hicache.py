"""HiCache storage throughput: our backend (mooncake_go.connectors.sglang)
against SGLang's built-in MooncakeStore backend on our compat module
(mooncake.store), in the same run, on the same data, against one
``mooncake up`` whose storage node holds the pages of both.

    bash e2e/py.sh sglang e2e/sglang/bench_hicache.py [--pages 64] [--repeats 9]

Each repeat writes one batch of pages with batch_set_v1 and reads it back
with batch_get_v1 into other pages of the same host pool, for each backend
in turn (the order alternates), with fresh keys, and checks the bytes;
the store is emptied between repeats. A memcpy of the batch's bytes
(torch, one thread) is the same-run yardstick of this machine's memory.
Figures are medians over the repeats, in GB/s of page bytes (and their
ratio, ours / built-in), printed as a table and as JSON (--json)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "python" / "tests"))

import torch  # noqa: E402

from mccluster import start_cluster  # noqa: E402
from mooncake_go import Store  # noqa: E402
from sgl_harness import sglang_env  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

OPS = ("set", "get", "prefetch")
BIN = Path(os.environ.get("MOONCAKE_BIN", HERE.parents[1] / "bin" / "mooncake"))


def pool(kind: str, pages: int, page: int):
    """A host pool of 2*pages+1 pages (a batch, its read-back, slack):
    MHA page_first (8 layers, 8 KV heads of 128, bf16: 1 MiB a page of 32
    tokens) or MLA layer_first (8 layers, 512 + 64, bf16)."""
    tokens = (2 * pages + 1) * page
    if kind == "mha":
        dev = MHATokenToKVPool(tokens, page, torch.bfloat16, 8, 128, 8, "cpu", False, start_layer=0, end_layer=8)
        return MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 1.0, 0, page, "page_first",
                                    pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                    start_layer=0, end_layer=8, write_back_staging=dev.hicache_write_back_staging)
    dev = MLATokenToKVPool(tokens, page, torch.bfloat16, 512, 64, 8, "cpu", False, start_layer=0, end_layer=8)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 1.0, 0, page, "layer_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=8, target_layer_num=8)


def attach(name: str, extra: dict, host):
    parsed, *_ = HybridCacheController.parse_storage_backend_extra_config(json.dumps(extra))
    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=isinstance(host, MLATokenToKVPoolHost), enable_storage_metrics=False,
        is_page_first_layout=host.layout == "page_first", model_name="bench/model", extra_config=parsed)
    b = StorageBackendFactory.create_backend(name, cfg, host)
    b.register_mem_pool_host(host)
    return b


def page_tokens(first: int, n: int, page: int) -> torch.Tensor:
    return torch.arange(first * page, (first + n) * page)


def batch_bytes(host, first: int, n: int, page: int) -> torch.Tensor:
    d = list(host.kv_buffer.shape).index(host.size)
    return host.kv_buffer.narrow(d, first * page, n * page)


def one_repeat(backend, host, pages: int, page: int, nbytes: int) -> dict:
    """GB/s of batches with fresh keys: set, then get (batch_get_v1 alone)
    of what was set; set again under other keys, then prefetch
    (batch_exists then batch_get_v1: what SGLang's prefetch thread does).
    Every read is the first of its keys; bytes checked after each."""
    src, dst = page_tokens(0, pages, page), page_tokens(pages, pages, page)
    out = {"set": []}
    for op in ("get", "prefetch"):
        toks = [int(x) for x in torch.randint(0, 30000, (pages * page,))]
        keys = get_hash_str(toks, uuid.uuid4().hex * 2, page_size=page)
        t0 = time.perf_counter()
        ok = backend.batch_set_v1(keys, src)
        out["set"].append(nbytes / (time.perf_counter() - t0) / 1e9)
        assert all(ok), f"set failed: {ok.count(False)} pages"
        batch_bytes(host, pages, pages, page).zero_()
        t0 = time.perf_counter()
        if op == "prefetch":
            assert backend.batch_exists(keys) == pages
        ok = backend.batch_get_v1(keys, dst)
        out[op] = [nbytes / (time.perf_counter() - t0) / 1e9]
        assert all(ok), f"{op} failed: {ok.count(False)} pages"
        assert torch.equal(batch_bytes(host, pages, pages, page), batch_bytes(host, 0, pages, page)), "bytes differ"
    return out


def memcpy_gbps(nbytes: int) -> float:
    """One warm copy of nbytes (the buffers touched once first)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return nbytes / (time.perf_counter() - t0) / 1e9


def run(kind: str, args, master: str, raw: Store) -> dict:
    hosts = {n: pool(kind, args.pages, args.page) for n in ("ours", "builtin")}
    for h in hosts.values():
        batch_bytes(h, 0, args.pages, args.page).copy_(
            torch.randn(batch_bytes(h, 0, args.pages, args.page).shape).to(h.kv_buffer.dtype))
    backends = {
        "ours": attach("dynamic", {"backend_name": "mooncake-go", "module_path": "mooncake_go.connectors.sglang",
                                   "class_name": "MooncakeGoHiCache", "interface_v1": 1, "master": master},
                       hosts["ours"]),
        # Its own segment none (0), as ours: both keep pages on the node.
        "builtin": attach("mooncake", {"master_server_address": master, "protocol": "tcp",
                                       "global_segment_size": 0}, hosts["builtin"]),
    }
    nbytes = batch_bytes(hosts["ours"], 0, args.pages, args.page).numel() * 2
    res = {n: {op: [] for op in OPS} for n in backends}
    copies = []
    for r in range(args.warmup + args.repeats):
        order = ["ours", "builtin"] if r % 2 == 0 else ["builtin", "ours"]
        for n in order:
            got = one_repeat(backends[n], hosts[n], args.pages, args.page, nbytes)
            if r >= args.warmup:
                for op in OPS:
                    res[n][op].extend(got[op])
            raw.remove_all(force=True)
        if r >= args.warmup:
            copies.append(memcpy_gbps(nbytes))
    out = {"layout": f"{kind} {hosts['ours'].layout}", "pages": args.pages, "page_bytes": nbytes // args.pages,
           "memcpy_gbps": statistics.median(copies)}
    for n in backends:
        for op in OPS:
            out[f"{n}_{op}_gbps"] = statistics.median(res[n][op])
    for op in OPS:
        out[f"{op}_ratio"] = out[f"ours_{op}_gbps"] / out[f"builtin_{op}_gbps"]
    for b in backends.values():
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=64, help="pages per batch (SGLang batches up to 128)")
    ap.add_argument("--page", type=int, default=32, help="tokens per page")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layouts", default="mha,mla")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    cluster = start_cluster(BIN, "--no-ha", "--nodes", "1", "--global_segment_size", "2GiB")
    try:
        os.environ.update(sglang_env(cluster.master))
        with Store(cluster.master, segment_size=-1) as raw:
            results = [run(k, args, cluster.master, raw) for k in args.layouts.split(",")]
    finally:
        cluster.stop()
    print(f"{'layout':18} {'page':>8} {'op':8} {'ours GB/s':>10} {'built-in':>10} {'ratio':>6} {'memcpy':>8}")
    for r in results:
        for op in OPS:
            print(f"{r['layout']:18} {r['page_bytes'] >> 10:>6}Ki {op:8} {r[f'ours_{op}_gbps']:>10.2f} "
                  f"{r[f'builtin_{op}_gbps']:>10.2f} {r[f'{op}_ratio']:>5.2f}x {r['memcpy_gbps']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""HiCache storage throughput: our backend (mooncake_go.connectors.sglang)
against SGLang's built-in MooncakeStore backend on our compat module
(mooncake.store), in the same run, on the same data, against one
``mooncake up`` whose storage node holds the pages of both.

    bash e2e/py.sh sglang e2e/sglang/bench_hicache.py [--pages 64] [--repeats 9]

Ops, on fresh keys each: set (batch_set_v1 of a batch of pages), get
(batch_get_v1 of pages just set, into other pages of the same host pool)
and prefetch (batch_exists then batch_get_v1, as SGLang's prefetch thread
does), for both backends back to back, their order alternating; reads are
checked byte for byte, and the store is emptied between repeats. Two
batch sizes: 64 pages (bytes dominate) and 4 (round trips dominate). A
warm memcpy of the batch's bytes (torch) is the yardstick of this
machine's memory. Figures: medians over the repeats of each side's time
(and GB/s of page bytes) and of the ratio of each pair (built-in time /
ours: above 1, ours is faster), as a table and as JSON (--json)."""

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


def fresh_keys(pages: int, page: int) -> list:
    toks = [int(x) for x in torch.randint(0, 30000, (pages * page,))]
    return get_hash_str(toks, uuid.uuid4().hex * 2, page_size=page)


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def memcpy_s(nbytes: int) -> float:
    """Seconds of one warm copy of nbytes (the buffers touched once first)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return timed(lambda: dst.copy_(src))


def run(kind: str, pages: int, args, master: str, raw: Store) -> dict:
    """Each repeat does, for both backends back to back (their order
    alternating), each op on a fresh batch: set; get (batch_get_v1 of
    pages just set); prefetch (batch_exists then batch_get_v1, SGLang's
    prefetch thread). Every read is the first of its keys and is checked
    byte for byte. The ratio of each pair is taken, so slow phases of a
    shared machine hit both sides of it."""
    page = args.page
    hosts = {n: pool(kind, pages, page) for n in ("ours", "builtin")}
    for h in hosts.values():
        view = batch_bytes(h, 0, pages, page)
        view.copy_(torch.randn(view.shape).to(view.dtype))
    backends = {
        "ours": attach("dynamic", {"backend_name": "mooncake-go", "module_path": "mooncake_go.connectors.sglang",
                                   "class_name": "MooncakeGoHiCache", "interface_v1": 1, "master": master,
                                   "protocol": "tcp"}, hosts["ours"]),
        # No segment of its own (0), as ours: both keep pages on the node.
        "builtin": attach("mooncake", {"master_server_address": master, "protocol": "tcp",
                                       "global_segment_size": 0}, hosts["builtin"]),
    }
    nbytes = batch_bytes(hosts["ours"], 0, pages, page).numel() * 2
    src, dst = page_tokens(0, pages, page), page_tokens(pages, pages, page)

    def op(name: str, n: str) -> float:
        b, h = backends[n], hosts[n]
        keys = fresh_keys(pages, page)
        if name == "set":
            ok = []
            t = timed(lambda: ok.extend(b.batch_set_v1(keys, src)))
            assert all(ok), f"{n}: set failed"
            return t
        assert all(b.batch_set_v1(keys, src)), f"{n}: set failed"
        batch_bytes(h, pages, pages, page).zero_()
        ok = []

        def read():
            if name == "prefetch":
                assert b.batch_exists(keys) == pages
            ok.extend(b.batch_get_v1(keys, dst))

        t = timed(read)
        assert all(ok), f"{n}: {name} failed"
        assert torch.equal(batch_bytes(h, pages, pages, page), batch_bytes(h, 0, pages, page)), f"{n}: bytes differ"
        return t

    secs = {n: {o: [] for o in OPS} for n in backends}
    ratios = {o: [] for o in OPS}
    copies = []
    for r in range(args.warmup + args.repeats):
        for o in OPS:
            order = ["ours", "builtin"] if r % 2 == 0 else ["builtin", "ours"]
            t = {n: op(o, n) for n in order}
            if r >= args.warmup:
                for n in order:
                    secs[n][o].append(t[n])
                ratios[o].append(t["builtin"] / t["ours"])
        raw.remove_all(force=True)
        if r >= args.warmup:
            copies.append(memcpy_s(nbytes))
    out = {"layout": f"{kind} {hosts['ours'].layout}", "pages": pages, "page_bytes": nbytes // pages,
           "memcpy_gbps": nbytes / statistics.median(copies) / 1e9, "repeats": args.repeats}
    for o in OPS:
        for n in backends:
            out[f"{n}_{o}_ms"] = statistics.median(secs[n][o]) * 1e3
            out[f"{n}_{o}_gbps"] = nbytes / statistics.median(secs[n][o]) / 1e9
        out[f"{o}_ratio"] = statistics.median(ratios[o])
    for b in backends.values():
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", default="64,4", help="pages per batch, a list (SGLang batches up to 128)")
    ap.add_argument("--page", type=int, default=32, help="tokens per page")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layouts", default="mha,mla")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    cluster = start_cluster(BIN, "--no-ha", "--nodes", "1", "--global_segment_size", "2GiB")
    try:
        os.environ.update(sglang_env(cluster.master))
        with Store(cluster.master, segment_size=-1) as raw:
            results = [run(k, int(p), args, cluster.master, raw)
                       for k in args.layouts.split(",") for p in args.pages.split(",")]
    finally:
        cluster.stop()
    print(f"{'layout':16} {'pages':>5} {'page':>7} {'op':8} {'ours ms':>8} {'built-in':>8} {'ours GB/s':>9} "
          f"{'built-in':>8} {'ratio':>6} {'memcpy GB/s':>11}")
    for r in results:
        for o in OPS:
            print(f"{r['layout']:16} {r['pages']:>5} {r['page_bytes'] >> 10:>5}Ki {o:8} {r[f'ours_{o}_ms']:>8.2f} "
                  f"{r[f'builtin_{o}_ms']:>8.2f} {r[f'ours_{o}_gbps']:>9.2f} {r[f'builtin_{o}_gbps']:>8.2f} "
                  f"{r[f'{o}_ratio']:>5.2f}x {r['memcpy_gbps']:>11.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

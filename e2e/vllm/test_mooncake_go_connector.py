"""Our own vLLM KV connector, MooncakeGoConnector
(mooncake_go.connectors.vllm, connectors/vllm in the repository), in real
vLLM processes.

Store tier: a writer instance computes prompts of several full blocks and
saves them to the store under keys made of vLLM's block hashes; a fresh
reader instance loads them instead of computing them (its log says how
many blocks) and answers as the writer did. Blocks written by the other
weights under the same keys change the reader's answers. With the master
stopped under a running server, requests still complete (recomputed).

PD: a prefill server answers with kv_transfer_params naming its blocks;
the decode server pulls them with one Transfer Engine READ per request and
tells the prefill server to free them. Decode tokens equal a
single-instance run; a prefill with the other weights changes them.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request

import pytest
from mccluster import start_cluster
from mooncake_go import Store
from tinymodel import text
from vllm_harness import (ENGINE_ARGS, MAX_TOKENS, free_port, http_json, prompts, run_offline, start_servers,
                          stop_process, wait_line)

BLOCK = 128  # vLLM's KV block on the CPU
# The connector's per-request lines are INFO. The harness's CPU workaround
# (cpu_workaround/sitecustomize.py) is off: this connector makes no
# accelerator call, which a GPU-less host with CUDA torch would refuse.
ENV = {"VLLM_LOGGING_LEVEL": "INFO", "MOONCAKE_E2E_CPU_WORKAROUND": "0"}


def go_kv(role: str, **extra) -> dict:
    """The kv_transfer_config a user writes (connectors/vllm/README.md)."""
    return {"kv_connector": "MooncakeGoConnector", "kv_connector_module_path": "mooncake_go.connectors.vllm",
            "kv_role": role, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"host": "127.0.0.1", **extra}}


def long_prompts() -> list:
    """Four prompts of 2 full blocks and a partial one."""
    return prompts(n=4, length=2 * BLOCK + 44)


def store_keys(cluster) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/get_all_keys", timeout=10) as r:
        return r.read().decode().split()


def expected_keys(ps: list, block: int = BLOCK) -> set:
    """The keys of every full block of ps, computed with vLLM's own block
    hashing (sha256, its default): "tiny@tp0@" and the low 64 bits of the
    block hash, big-endian, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 has
    vLLM publish them."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as ku

    fn = get_hash_fn_by_name("sha256")
    ku.init_none_hash(fn)
    keys = set()
    for p in ps:
        parent = None
        for i in range(len(p) // block):
            parent = ku.hash_block_tokens(fn, parent, p[i * block:(i + 1) * block])
            keys.add(f"tiny@tp0@{ku.maybe_convert_block_hash(parent):016x}")
    return keys


def loaded_blocks(log) -> int:
    """Blocks the connector says it loaded from the store."""
    return sum(int(m.group(1)) for m in re.finditer(r"mooncake-go connector: loaded (\d+) blocks", log.read_text()))


def full_blocks(ps, block: int = BLOCK) -> int:
    return sum(len(p) // block for p in ps)


def engine_block(log) -> int:
    """The block size an offline engine settled on (run_llm.py's line)."""
    return int(re.search(r"run_llm: blocks of (\d+) tokens", log.read_text()).group(1))


def window_blocks(n: int, block: int, window: int) -> int:
    """The full blocks of an n-token prompt that a reader of a sliding-window
    model loads when the store holds them all: vLLM leaves out the blocks
    whose every token lies before the window of the first token it computes
    (its null block takes their places)."""
    full = n // block
    return full - max(0, full * block - window + 1) // block


def write_and_read(models, logs, cluster, writer: str, tag: str):
    """A writer instance (weights `writer`) saves the prompts' blocks; a
    fresh reader instance (weights a) loads them. Returns both answers and
    the reader's log."""
    kv = go_kv("kv_both", master=cluster.master)
    ps = long_prompts()
    wait = {"url": f"http://127.0.0.1:{cluster.metrics_port}/get_all_keys", "count": full_blocks(ps), "timeout": 60}
    wrote = run_offline(models[writer], ps, logs / f"{tag}-writer.log", kv=kv, env=ENV, wait_keys=wait)
    reader_log = logs / f"{tag}-reader.log"
    read = run_offline(models["a"], ps, reader_log, kv=kv, env=ENV)
    return wrote, read, reader_log


def test_store_tier_reader_loads_blocks_saved_by_another_instance(models, logs, cluster):
    ps = long_prompts()
    wrote, read, reader_log = write_and_read(models, logs, cluster, "a", "store")
    assert loaded_blocks(logs / "store-writer.log") == 0, "the writer found blocks in an empty store"
    assert set(store_keys(cluster)) == expected_keys(ps)
    assert loaded_blocks(reader_log) == full_blocks(ps), reader_log.read_text()[-3000:]
    assert read == wrote

    # The same keys holding 100 bytes each: a reader's lookups find them,
    # its loads fill only the blocks' first bytes, and it must report the
    # blocks as failed so that vLLM recomputes them (kv_load_failure_policy
    # "recompute"); used as they are, they would change the answers.
    keys = sorted(expected_keys(ps))
    with Store(cluster.master, segment_size=-1) as st:
        assert st.batch_upsert(keys, [b"x" * 100] * len(keys)) == [None] * len(keys)
    bad_log = logs / "store-bad.log"
    assert run_offline(models["a"], ps, bad_log, kv=go_kv("kv_both", master=cluster.master), env=ENV) == wrote
    text = bad_log.read_text()
    assert loaded_blocks(bad_log) == 0
    assert len(re.findall(r"loading block 0 of request \S+ from the store failed", text)) == len(ps), text[-3000:]


def test_store_tier_negative_control_other_weights_change_the_answer(models, logs, mooncake_bin):
    """The same keys (same model name, same prompts) written by the other
    weights: a reader that really loads them answers differently."""
    other = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB", admin=True)
    try:
        _, read, reader_log = write_and_read(models, logs, other, "b", "neg")
        baseline = run_offline(models["a"], long_prompts(), logs / "neg-baseline.log")
    finally:
        other.stop()
    assert loaded_blocks(reader_log) == full_blocks(long_prompts())
    assert all(r != b for r, b in zip(read, baseline)), "the reader ignored the blocks it loaded"


def test_store_tier_sliding_window_saves_each_block_before_the_window_frees_it(tmp_path, logs, mooncake_bin):
    """A sliding-window model (a window of 128 tokens, one CPU block) and a
    chunked prefill (128 tokens a step, two requests at a time): vLLM frees
    each block once it falls out of the window, long before the whole
    prompt is computed, and puts its null block in its place. The writer
    saves every block in the step that fills it; readers of shorter
    prefixes load the blocks they still read and answer as a run without
    the connector does. (Saved once the prompt was computed, the early
    blocks were the null block's bytes, and readers answered differently:
    2 of 4 here.) On a GPU, vLLM gives sliding-window layers the attention
    kernel's smallest block (16 tokens for FlashAttention) whatever the
    block size asked for: the keys and loads follow the block size the
    engine settled on."""
    import json

    import tinymodel

    model = tinymodel.write(tmp_path / "sw" / "tiny", 1, sliding_window=BLOCK)
    ps = prompts(n=4, length=3 * BLOCK + 44)
    short = [p[:2 * BLOCK + 44] for p in ps]
    # Added to the host's engine arguments (a GPU host's block size of 128
    # among them), not in their place.
    engine_args = {**ENGINE_ARGS, "max_num_batched_tokens": BLOCK, "max_num_seqs": 2}
    env = {**ENV, "MOONCAKE_E2E_VLLM_ENGINE_ARGS": json.dumps(engine_args)}
    baseline = run_offline(model, short, logs / "sw-baseline.log", env=env)
    cluster = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB", admin=True)
    try:
        kv = go_kv("kv_both", master=cluster.master)
        wait = {"url": f"http://127.0.0.1:{cluster.metrics_port}/get_all_keys", "count": "full_blocks",
                "timeout": 60}
        run_offline(model, ps, logs / "sw-writer.log", kv=kv, env=env, wait_keys=wait)
        block = engine_block(logs / "sw-writer.log")
        assert set(store_keys(cluster)) == expected_keys(ps, block)
        reader_log = logs / "sw-reader.log"
        read = run_offline(model, short, reader_log, kv=kv, env=env)
    finally:
        cluster.stop()
    assert read == baseline
    # Each reader loads the blocks it reads (on the CPU one: the window
    # skips the first).
    want = sum(window_blocks(len(p), block, window=BLOCK) for p in short)
    assert want < full_blocks(short, block)
    assert loaded_blocks(reader_log) == want, reader_log.read_text()[-3000:]
    assert "each step waits for the saves" in (logs / "sw-writer.log").read_text()


def completion(url: str, prompt, max_tokens: int = MAX_TOKENS, kv: dict | None = None,
               timeout: float = 120) -> dict:
    """The whole completion response (choices[0]["token_ids"]: the tokens)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    if kv is not None:
        body["kv_transfer_params"] = kv
    return http_json(url + "/v1/completions", body, timeout=timeout)


def tokens(resp: dict) -> list:
    return resp["choices"][0]["token_ids"]


def test_store_unavailable_mid_run_requests_recompute(models, logs, mooncake_bin):
    """A server whose store master is stopped while it runs: the requests
    after it (one whose blocks were saved, one new) complete, within the
    test's deadline, with the tokens of a normal run."""
    cluster = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB", admin=True)
    server = None
    try:
        (server,) = start_servers([("s", models["a"], free_port(), logs / "store-down.log",
                                    {"kv": go_kv("kv_both", master=cluster.master, lookup_timeout=1,
                                                 load_timeout=3), "env": ENV})])
        p0, p1 = long_prompts()[:2]
        first = tokens(completion(server.url, p0))
        deadline = time.monotonic() + 60
        while len(store_keys(cluster)) < len(p0) // BLOCK:
            assert time.monotonic() < deadline, "the server saved no block"
            time.sleep(0.2)
        cluster.stop()
        start = time.monotonic()
        again = tokens(completion(server.url, p0, timeout=60))
        fresh = tokens(completion(server.url, p1, timeout=60))
        took = time.monotonic() - start
        assert again == first
        assert len(fresh) == MAX_TOKENS
        assert took < 60, f"requests took {took:.0f} s with the store down"
        assert "unavailable" in server.log.read_text(), "the connector did not notice the store was down"
    finally:
        if server is not None:
            server.stop()
        cluster.stop()


@pytest.fixture(scope="module")
def pd(models, logs):
    """D decodes (weights a); PA prefills with the same weights, PB with
    the other ones."""
    servers = start_servers([
        ("d", models["a"], free_port(), logs / "go-d.log", {"kv": go_kv("kv_consumer"), "env": ENV}),
        ("pa", models["a"], free_port(), logs / "go-pa.log", {"kv": go_kv("kv_producer"), "env": ENV}),
        ("pb", models["b"], free_port(), logs / "go-pb.log", {"kv": go_kv("kv_producer"), "env": ENV}),
    ])
    yield dict(zip(("d", "pa", "pb"), servers))
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def pd_baseline(pd):
    """D on its own: no kv_transfer_params, nothing to pull."""
    return [tokens(completion(pd["d"].url, p)) for p in long_prompts()]


def disaggregated(pd, prefill) -> list:
    """Each prompt prefilled on `prefill` (max_tokens 1, do_remote_decode),
    then decoded on D with the kv_transfer_params of the prefill's answer,
    passed on unchanged (as mooncake conductor does)."""
    out = []
    for p in long_prompts():
        params = completion(prefill.url, p, max_tokens=1, kv={"do_remote_decode": True})["kv_transfer_params"]
        assert params and params["do_remote_prefill"] and params["remote_block_ids"], params
        out.append(tokens(completion(pd["d"].url, p, kv=params)))
    return out


def pulled(log) -> int:
    return len(re.findall(r"mooncake-go connector: pulled \d+ blocks", log.read_text()))


def test_pd_decode_from_pulled_kv_equals_single_instance(pd, pd_baseline):
    before = pulled(pd["d"].log)
    assert disaggregated(pd, pd["pa"]) == pd_baseline
    assert pulled(pd["d"].log) - before == len(pd_baseline)
    # The prefill server freed each request's blocks on the decode's notice.
    deadline = time.monotonic() + 30
    while len(re.findall(r"freed after the decode pulled", pd["pa"].log.read_text())) < len(pd_baseline):
        assert time.monotonic() < deadline, pd["pa"].tail()
        time.sleep(0.2)


def test_pd_negative_control_other_weights_prefill_differs(pd, pd_baseline):
    got = disaggregated(pd, pd["pb"])
    assert all(g != b for g, b in zip(got, pd_baseline)), "decode ignored the KV it pulled"


@pytest.fixture(scope="module")
def conductors(pd, mooncake_bin, logs):
    """`mooncake conductor` in front of D, once with PA as its prefill
    instance and once with PB: it passes the prefill answer's
    kv_transfer_params on to D unchanged."""
    urls, procs = {}, []
    try:
        for name in ("pa", "pb"):
            log = logs / f"go-conductor-{name}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(
                    [str(mooncake_bin), "conductor", "--listen", "127.0.0.1:0", "--prefill", f"{name}={pd[name].url}",
                     "--decode", f"d={pd['d'].url}", "--admission", "none"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            # "conductor listening http://127.0.0.1:PORT prefill=1 decode=1"
            urls[name] = wait_line(log, "conductor listening", proc).split()[2]
        yield urls
    finally:
        for proc in procs:
            stop_process(proc, grace=5, group=True)


def test_pd_behind_conductor_equals_single_instance(pd, conductors):
    ps = long_prompts()[:2]
    body = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}

    def answers(url):
        return [http_json(url + "/v1/completions", dict(body, prompt=text(p)))["choices"][0]["text"] for p in ps]

    want = answers(pd["d"].url)
    assert all(want), "the baseline produced no text"
    before = pulled(pd["d"].log)
    assert answers(conductors["pa"]) == want
    assert pulled(pd["d"].log) - before == len(ps), "D did not pull through the conductor's route"
    got = answers(conductors["pb"])
    assert all(g != w for g, w in zip(got, want)), "decode ignored the KV it pulled"


# -- the connector's pieces without vLLM processes ---------------------------


@pytest.mark.parametrize("shape,block_dim,perm", [
    ((5, 2, 8, 16), 0, None),  # vLLM 0.32's CPU backend: [blocks, kv_heads, block_size, 2*head_size]
    ((2, 5, 8, 2, 4), 1, None),  # K and V apart: [2, blocks, block_size, kv_heads, head_size]
    # vLLM 0.26's FlashAttention on a GPU: [blocks, kv_heads, block_size, 2*head_size]
    # over memory laid out [blocks, block_size, kv_heads, 2*head_size] (VLLM_KV_CACHE_LAYOUT=NHD)
    ((5, 8, 2, 16), 0, (0, 2, 1, 3)),
])
def test_layout_runs_cover_exactly_one_block(shape, block_dim, perm):
    """Each block's runs hold that block's elements and nothing else,
    whichever dimension holds the blocks and in whatever order its
    elements lie."""
    import ctypes

    import torch
    from mooncake_go.connectors.vllm.layout import Layout

    t = torch.zeros(shape, dtype=torch.bfloat16)
    if perm:
        t = t.permute(perm)
    for b in range(5):
        t.select(block_dim, b).fill_(b + 1)
    layout = Layout({"layer.0": t, "layer.1": t.clone() * 0}, 5)
    assert layout.block_bytes == t.nbytes // 5 * 2
    for b in range(5):
        addrs, lens = layout.parts(b)
        first = b"".join(ctypes.string_at(a, n) for a, n in zip(addrs[:len(addrs) // 2], lens))
        want = t.select(block_dim, b).contiguous().view(torch.uint8).numpy().tobytes()
        assert first == want


def test_layout_refuses_a_block_that_is_not_contiguous():
    import torch
    from mooncake_go.connectors.vllm.layout import Layout

    t = torch.zeros(8, 5, 4, dtype=torch.bfloat16).transpose(0, 2)  # blocks in the middle, strided
    with pytest.raises(ValueError, match="not contiguous"):
        Layout({"layer.0": t}, 5)


def test_pull_refuses_a_prefill_whose_blocks_lie_in_another_order():
    """vLLM 0.26's FlashAttention cache is [blocks, kv_heads, block_size,
    2*head_size] over memory laid out [blocks, block_size, kv_heads, ...]
    by default (VLLM_KV_CACHE_LAYOUT=NHD) and as its shape says with HND.
    Both are accepted and their runs have equal strides and lengths, but a
    block's bytes mean different things: a decode instance must not pull
    one's blocks into the other (it recomputes instead)."""
    from types import SimpleNamespace as NS

    import torch
    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.connector import MooncakeGoConnector
    from mooncake_go.connectors.vllm.jobs import PullJob
    from mooncake_go.connectors.vllm.layout import Layout, remote_mismatch
    from mooncake_go.connectors.vllm.scheduler import SchedulerSide
    from mooncake_go.connectors.vllm.worker import WorkerSide
    from vllm.v1.request import RequestStatus

    nb, heads, bs, d2 = 6, 2, 16, 8
    nhd = {"layer.0": torch.zeros(nb, bs, heads, d2, dtype=torch.bfloat16).permute(0, 2, 1, 3)}
    hnd = {"layer.0": torch.zeros(nb, heads, bs, d2, dtype=torch.bfloat16)}
    assert nhd["layer.0"].shape == hnd["layer.0"].shape
    assert Layout(nhd, nb).shape() == Layout(hnd, nb).shape()  # what the pull compared

    config = NS(cache_config=NS(block_size=bs), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    settings = Settings.from_config({}, "kv_both")

    def published(caches) -> dict:
        """The worker entry a prefill instance with these caches hands a decode instance."""
        prefill = WorkerSide(config, settings, nb)
        prefill.layout, prefill.engine = Layout(caches, nb), NS(name="prefill")
        sched = SchedulerSide(config, settings)
        sched.set_workers({0: MooncakeGoConnector.get_handshake_metadata(NS(_worker=prefill))})
        req = NS(request_id="r", kv_transfer_params={"do_remote_decode": True},
                 status=RequestStatus.FINISHED_LENGTH_CAPPED)
        return sched.request_finished(req, [3, 4])[1]["remote_workers"][0]

    # Positive control: equal layouts agree, in either order.
    assert remote_mismatch(Layout(nhd, nb), published(nhd)) is None
    assert remote_mismatch(Layout(hnd, nb), published(hnd)) is None
    # A peer from before the order was published: its blocks were contiguous.
    old = {k: v for k, v in published(hnd).items() if k != "order"}
    assert remote_mismatch(Layout(hnd, nb), old) is None
    assert remote_mismatch(Layout(nhd, nb), old) is not None

    decode = WorkerSide(config, settings, nb)
    decode.layout = Layout(nhd, nb)  # no engine: the pull must stop before any transfer
    decode._pull(PullJob("r", [1, 2], [3, 4], "r", [published(hnd)]))
    assert decode.get_block_ids_with_load_errors() == {1, 2}


def test_settings_and_keys():
    from mooncake_go.connectors.vllm.config import Settings, block_key, key_prefix

    s = Settings.from_config({"master": "h:1", "segment_size": "1GB", "tenant": "t1"}, "kv_consumer")
    assert (s.segment_size, s.save, s.load) == (1 << 30, False, True)
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config keys"):
        Settings.from_config({"mastr": "h:1"}, "kv_both")
    with pytest.raises(ValueError, match="must not contain '@'"):
        key_prefix("/m/tiny", 0, tenant="a@b")
    h = bytes(range(32))  # a sha256 block hash: the key holds its last 8 bytes
    assert block_key(key_prefix("/models/tiny/", 3, tenant="t1"), h) == "t1/tiny@tp3@18191a1b1c1d1e1f"


def test_saves_follow_block_ids_when_vllm_binds_no_kv_cache_manager():
    """vLLM releases without bind_kv_cache_manager (0.26, the last built for
    torch 2.11) never hand the connector their KV cache manager: the saves
    take each request's block ids from the scheduler's outputs. A chunked
    prompt gets its blocks over two steps, each saved in the step that
    fills it; a request preempted and resumed gets all of them again, in
    new places."""
    from types import SimpleNamespace as NS

    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.scheduler import SchedulerSide

    config = NS(cache_config=NS(block_size=BLOCK), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    side = SchedulerSide(config, Settings.from_config({"master": "127.0.0.1:1"}, "kv_both"))
    for rid in ("chunked", "resumed"):
        side._reqs[rid] = NS(num_prompt_tokens=2 * BLOCK + 44, block_hashes=[bytes([i]) * 32 for i in range(2)])

    def step(new=(), cached=(), resumed=()):
        """new: (rid, computed, block_ids, scheduled); cached: (rid, computed, new_block_ids, scheduled)."""
        out = NS(scheduled_new_reqs=[NS(req_id=r, num_computed_tokens=c, block_ids=(ids,)) for r, c, ids, _ in new],
                 scheduled_cached_reqs=NS(req_ids=[r for r, *_ in cached], resumed_req_ids=set(resumed),
                                          num_computed_tokens=[c for _, c, _, _ in cached],
                                          new_block_ids=[None if ids is None else (ids,) for _, _, ids, _ in cached]),
                 num_scheduled_tokens={r: n for r, _, _, n in list(new) + list(cached)})
        return {s.req_id: s.block_ids for s in side.build_connector_meta(out).saves}

    assert step(new=[("chunked", 0, [10], BLOCK), ("resumed", 0, [20, 21], 100)]) == {"chunked": [10]}
    assert step(cached=[("chunked", BLOCK, [11, 12], BLOCK + 44), ("resumed", 0, [30, 31, 32], 2 * BLOCK + 44)],
                resumed=["resumed"]) == {"chunked": [11], "resumed": [30, 31]}
    # Released with its request.
    side.request_finished(NS(request_id="chunked", kv_transfer_params=None), [])
    assert "chunked" not in side._block_ids


def _sliding_blocks(ids, nulls):
    """vLLM's own KVCacheBlocks over blocks ids, the places in nulls holding
    its null block (block 0), as a sliding window leaves them."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    blocks = []
    for i, b in enumerate(ids):
        blk = KVCacheBlock(0 if i in nulls else b)
        blk.is_null = i in nulls
        blocks.append(blk)
    return KVCacheBlocks((blocks,))


def test_saves_and_loads_leave_out_the_blocks_a_sliding_window_freed():
    """With vLLM's KV cache manager bound, a chunked prompt under a sliding
    window: each block is saved in the step that fills it, never from the
    null block that takes its place once the window passed it; a load or a
    pull writes nothing into the null block's places."""
    from types import SimpleNamespace as NS

    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.scheduler import SchedulerSide

    config = NS(cache_config=NS(block_size=BLOCK), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    side = SchedulerSide(config, Settings.from_config({"master": "127.0.0.1:1"}, "kv_both"))
    held = {"r": ([], set())}  # block ids, null places
    side._kv_cache_manager = NS(get_blocks=lambda rid: _sliding_blocks(*held[rid]))
    side._reqs["r"] = NS(num_prompt_tokens=3 * BLOCK + 44, block_hashes=[bytes([i]) * 32 for i in range(3)])

    def step(computed, scheduled, ids, nulls, new=False):
        held["r"] = (ids, set(nulls))
        cached = NS(req_ids=[], resumed_req_ids=set(), num_computed_tokens=[], new_block_ids=[])
        reqs = []
        if new:
            reqs = [NS(req_id="r", num_computed_tokens=computed, block_ids=(ids,))]
        else:
            cached = NS(req_ids=["r"], resumed_req_ids=set(), num_computed_tokens=[computed], new_block_ids=[None])
        out = NS(scheduled_new_reqs=reqs, scheduled_cached_reqs=cached, num_scheduled_tokens={"r": scheduled})
        return [(s.block_ids, [k[-2:] for k in s.keys]) for s in side.build_connector_meta(out).saves]

    # A window of one block: block i is freed once block i+2 is being computed.
    assert step(0, BLOCK, [5], [], new=True) == [([5], ["00"])]
    assert step(BLOCK, BLOCK, [5, 6], []) == [([6], ["01"])]
    assert step(2 * BLOCK, BLOCK, [5, 6, 7], [0]) == [([7], ["02"])]
    assert step(3 * BLOCK, 44, [5, 6, 7, 8], [0, 1]) == []  # the partial block is never saved
    assert "r" in side._saving

    # A reader whose first place the window already skipped loads the rest.
    side._plans["q"] = ("store", 0, ["k0", "k1"])
    side.update_state_after_alloc(NS(request_id="q", kv_transfer_params=None), _sliding_blocks([0, 9], {0}), 2 * BLOCK)
    (load,) = side.build_connector_meta(NS(scheduled_new_reqs=[], num_scheduled_tokens={},
                                           scheduled_cached_reqs=NS(req_ids=[], num_computed_tokens=[],
                                                                    new_block_ids=[]))).loads
    assert (load.keys, load.block_ids) == (["k1"], [9])

    # A decode instance pulls only into the places it reads.
    params = {"do_remote_prefill": True, "remote_block_ids": [0, 0, 31], "remote_request_id": "p",
              "remote_workers": [{"engine": "x"}]}
    side._plans["d"] = ("pd", 0, params)
    side.update_state_after_alloc(NS(request_id="d", kv_transfer_params=params, num_prompt_tokens=3 * BLOCK),
                                  _sliding_blocks([0, 0, 12], {0, 1}), 3 * BLOCK)
    (pull,) = side.build_connector_meta(NS(scheduled_new_reqs=[], num_scheduled_tokens={},
                                           scheduled_cached_reqs=NS(req_ids=[], num_computed_tokens=[],
                                                                    new_block_ids=[]))).pulls
    assert (pull.block_ids, pull.remote_block_ids) == ([12], [31])


def test_pull_refuses_blocks_the_prefill_instance_no_longer_holds():
    """A prefill instance's sliding window freed a block the decode instance
    still reads (vLLM's null block, 0, in its place): the pull fails before
    any transfer and vLLM recomputes those blocks."""
    from types import SimpleNamespace as NS

    import torch
    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.jobs import PullJob
    from mooncake_go.connectors.vllm.layout import Layout
    from mooncake_go.connectors.vllm.worker import WorkerSide

    caches = {"layer.0": torch.zeros(6, 2, 16, 8, dtype=torch.bfloat16)}
    config = NS(cache_config=NS(block_size=16), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    decode = WorkerSide(config, Settings.from_config({}, "kv_both"), 6)
    decode.layout = Layout(caches, 6)  # no engine: the pull must stop before any transfer
    w = {"engine": "prefill", "runs": [list(r) for r in decode.layout.runs],
         "order": [list(o) for o in decode.layout.order]}
    decode._pull(PullJob("r", [1, 2], [0, 4], "r", [w]))
    assert decode.get_block_ids_with_load_errors() == {1, 2}


def test_a_sliding_window_step_starts_once_the_saves_before_it_ended():
    """Where vLLM frees blocks of running requests, a step writes none of
    them (its forward pass, its loads) before the saves queued by the steps
    before no longer read them: the connector waits in handle_preemptions,
    which vLLM calls before the step's forward (the model runner's
    execute_model; model runner V2's pre_forward). Not in start_load_kv:
    vLLM 0.32 calls it only once the forward is launched for steps without
    synchronous loads (KVConnectorModelRunnerMixin._get_kv_connector_output,
    ActiveKVConnector.post_forward), too late. Without a window it waits
    only for the requests vLLM preempted."""
    import threading
    from types import SimpleNamespace as NS

    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.connector import MooncakeGoConnector, MooncakeGoMetadata, frees_running_blocks
    from mooncake_go.connectors.vllm.worker import WorkerSide
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    import torch

    spec = dict(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    window = NS(kv_cache_groups=[KVCacheGroupSpec(["l0"], SlidingWindowSpec(**spec, sliding_window=32))])
    full = NS(kv_cache_groups=[KVCacheGroupSpec(["l0"], FullAttentionSpec(**spec))])
    assert frees_running_blocks(None, window) and not frees_running_blocks(None, full)

    config = NS(cache_config=NS(block_size=16), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    for fence in (True, False):
        conn = MooncakeGoConnector.__new__(MooncakeGoConnector)  # the worker role's, without vLLM's config
        conn._scheduler = None
        conn._worker = w = WorkerSide(config, Settings.from_config({}, "kv_both"), 6, fence_saves=fence)
        w._saving["r"] = 1  # a save of an earlier step, still reading
        done = threading.Timer(0.3, w._save_done, ("r",))
        done.start()
        conn.handle_preemptions(MooncakeGoMetadata())  # no request preempted this step
        assert (w._saving["r"] == 0) is fence
        done.join()
        # A preempted request's saves are waited for either way.
        w._saving["r"] = 1
        done = threading.Timer(0.3, w._save_done, ("r",))
        done.start()
        conn.handle_preemptions(MooncakeGoMetadata(preempted=["r"]))
        assert w._saving["r"] == 0
        done.join()


def test_saves_leave_out_the_null_block_when_vllm_binds_no_kv_cache_manager():
    """vLLM 0.26 (no KV cache manager bound): a new request of a
    sliding-window model whose prefix hit vLLM's cache gets vLLM's null
    block (block 0) in the places the window skips (SlidingWindowManager.
    find_longest_cache_hit), and its block ids from the scheduler's output
    say 0 there. Those places are never saved: the store would hold the
    null block's bytes under their keys."""
    from types import SimpleNamespace as NS

    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.scheduler import SchedulerSide

    config = NS(cache_config=NS(block_size=BLOCK), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    side = SchedulerSide(config, Settings.from_config({"master": "127.0.0.1:1"}, "kv_both"))
    side._reqs["hit"] = NS(num_prompt_tokens=4 * BLOCK + 44, block_hashes=[bytes([i]) * 32 for i in range(4)])
    out = NS(scheduled_new_reqs=[NS(req_id="hit", num_computed_tokens=3 * BLOCK, block_ids=([0, 0, 7, 8],))],
             scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), num_computed_tokens=[], new_block_ids=[]),
             num_scheduled_tokens={"hit": BLOCK + 44})
    (save,) = side.build_connector_meta(out).saves
    assert save.block_ids == [7, 8]
    assert [k[-2:] for k in save.keys] == ["02", "03"]


def test_a_save_that_fails_counts_as_done_once():
    """A save job that fails (here its fence: the device is lost) counts as
    done once: a request saving chunk by chunk has more jobs queued, and the
    connector must still wait for those before vLLM reuses their blocks."""
    import queue
    from types import SimpleNamespace as NS

    import torch
    from mooncake_go.connectors.vllm.config import Settings
    from mooncake_go.connectors.vllm.jobs import SaveJob
    from mooncake_go.connectors.vllm.layout import Layout
    from mooncake_go.connectors.vllm.worker import WorkerSide

    class LostDevice:
        def synchronize(self):
            raise RuntimeError("the device is lost")

    config = NS(cache_config=NS(block_size=16), kv_transfer_config=NS(engine_id="e"), model_config=NS(model="tiny"))
    w = WorkerSide(config, Settings.from_config({"master": "127.0.0.1:1"}, "kv_both"), 6)
    w.layout = Layout({"layer.0": torch.zeros(6, 2, 16, 8, dtype=torch.bfloat16)}, 6)
    w._store = object()  # never used: the fence fails first
    w._saving["r"] = 2  # two save jobs of request r queued
    q = queue.Queue()
    q.put((LostDevice(), SaveJob("r", ["k"], [1])))
    q.put(None)
    w._serve(q, w._save)
    assert w._saving["r"] == 1

"""The Conductor's global policy (the paper's Algorithm 1) with real vLLM:
two prefill instances with our connector (MooncakeGoConnector: its store
tier saves every full block to Mooncake Store and loads the blocks a
prompt misses locally), the store's KV events and the engines' own
feeding the Conductor's index.

A prompt whose prefix the busy instance holds goes to the idle one when
the Conductor's model (Algorithm 1) says pulling the prefix from the store
beats the holder's queue, and the idle instance's connector loads it from
there (vLLM's own external-hit counter shows the tokens) instead of
recomputing it; the output is the holder's. The negative control: the
same Conductor forbidden to count pulls keeps the prompt on the holder.
The busy instance is made busy by freezing it (SIGSTOP) once the
Conductor scheduled a prompt onto it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request

import pytest

from mccluster import field, free_port, start_cluster
from test_conductor_kv_events import kv_events, start_conductor, wait_for
from vllm_harness import http_json, prompts, start_servers, stop_process

BLOCK = 128  # vLLM's block size on CPU


@pytest.fixture(scope="module")
def store(mooncake_bin):
    """`mooncake up` whose master publishes its KV events; (cluster, events
    endpoint, replay endpoint)."""
    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB",
                      "--enable_kv_events", "--kv_events_bind_endpoint", "tcp://127.0.0.1:0",
                      "--kv_events_replay_endpoint", "tcp://127.0.0.1:0")
    line = next(x for x in c.lines if x.startswith("master") and "kv_events=" in x)
    yield c, field(line, "kv_events"), field(line, "kv_events_replay")
    c.stop()


@pytest.fixture(scope="module")
def engines(store, models, logs):
    """Prefill instances p0 and p1 with our connector and KV events;
    {name: (server, pub port, replay port)}."""
    cluster = store[0]
    kv = {"kv_connector": "MooncakeGoConnector", "kv_connector_module_path": "mooncake_go.connectors.vllm",
          "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
          "kv_connector_extra_config": {"master": cluster.master, "host": "127.0.0.1"}}
    ports = {n: (free_port(), free_port(), free_port()) for n in ("p0", "p1")}
    specs = [(n, models["a"], ports[n][0], logs / f"global-{n}.log", {"kv": kv, "extra": kv_events(*ports[n][1:])})
             for n in ("p0", "p1")]
    servers = start_servers(specs)
    yield {s.name: (s, *ports[s.name][1:]) for s in servers}
    for s in servers:
        s.stop()


def start_global(engines, store, mooncake_bin, log, *extra):
    """`mooncake conductor` under the global policy, its index fed by both
    engines' events and the store's; p1 doubles as the decode instance.
    The scheduler's model of this deployment: a prefill costs 10 ms per
    new token (a queued prompt outweighs the timing of the test's steps
    by far) and a block from the store 1 ms (1 MiB at 1 GB/s). Returns
    (process, URL)."""
    return start_conductor(mooncake_bin, engines, log, "--prefill-model", "10ms,10ms",
                           "--block-bytes", "1MiB", "--bandwidth", str(10**9),
                           "--store-kv-events", store[1], "--store-kv-replay", store[2], "--log-level", "debug",
                           *extra, policy="global-cache-aware", decode="p1", prefix="")


@pytest.fixture(scope="module")
def conductor(engines, store, mooncake_bin, logs):
    proc, url = start_global(engines, store, mooncake_bin, logs / "conductor-global.log")
    yield url
    stop_process(proc, grace=5, group=True)


@pytest.fixture(scope="module")
def no_pulls(engines, store, mooncake_bin, logs):
    """The negative control: the same Conductor, but a prefix held
    elsewhere is pulled only when it is over 1000 blocks longer than the
    instance's own, i.e. never here."""
    proc, url = start_global(engines, store, mooncake_bin, logs / "conductor-no-pulls.log",
                             "--balance-blocks", "1000")
    yield url
    stop_process(proc, grace=5, group=True)


def vllm_counter(url: str, name: str) -> float:
    """A counter of vLLM's /metrics, summed over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)


def prefix_blocks(conductor: str, prompt: list) -> dict:
    return http_json(conductor + "/v1/index/query", {"tokens": prompt})["prefix_blocks"]


def through(conductor: str, prompt: list, max_tokens: int, out: dict) -> None:
    """A completion through the Conductor; fills out with its prefill
    instance and generated tokens."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    req = urllib.request.Request(conductor + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out["prefill"] = r.headers["X-Conductor-Prefill"]
        out["tokens"] = json.loads(r.read())["choices"][0]["token_ids"]


def busy_holder(engines, conductor: str, seed: int) -> tuple:
    """The scenario: p0 holds a shared prefix (and the store has it), p0
    gets a prompt and is kept busy with it, and the shared prompt comes.
    Nothing else goes through the Conductor first: the decode instance p1
    would then hold the prefix of what it decoded.
    Returns (the busy prompt's answer, the shared prompt's answer, p0's own
    tokens for the shared prompt, prompt tokens p1 loaded meanwhile)."""
    p0, p1 = engines["p0"][0], engines["p1"][0]
    shared = prompts(1, length=2 * BLOCK + 40, seed=seed)[0]
    warm_busy = prompts(1, length=2 * BLOCK, seed=seed + 1)[0]
    busy = warm_busy + prompts(1, length=BLOCK, seed=seed + 2)[0]
    # p0 computes both prefixes; its connector saves their blocks to the
    # store, and the index learns of them from p0's events and the store's.
    want = http_json(p0.url + "/v1/completions", {"model": "tiny", "prompt": shared, "max_tokens": 4,
                                                  "temperature": 0, "return_token_ids": True})
    http_json(p0.url + "/v1/completions", {"model": "tiny", "prompt": warm_busy, "max_tokens": 1, "temperature": 0})
    for prompt in (shared, warm_busy):
        wait_for(lambda: (b := prefix_blocks(conductor, prompt)).get("p0") == 2 and b.get("store", 0) >= 2 and b,
                 "p0's and the store's blocks in the index", timeout=60)
    assert prefix_blocks(conductor, shared).get("p1", 0) == 0

    # Busy: p0 is frozen (SIGSTOP) so that the prompt scheduled onto it
    # stays in its queue while the shared prompt is scheduled.
    loaded_before = vllm_counter(p1.url, "vllm:external_prefix_cache_hits_total")
    reused_before = conductor_counter(conductor, "mooncake_conductor_reused_blocks_total")
    first, second = {}, {}
    # If the shared prompt goes to p0 too, p0 answers it once thawed.
    thaw = threading.Timer(3, os.killpg, (p0.proc.pid, signal.SIGCONT))
    os.killpg(p0.proc.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=through, args=(conductor, busy, 1, first), daemon=True)
        t.start()
        # Scheduled (onto p0, which holds its first two blocks) once the
        # Conductor counts them reused.
        wait_for(lambda: conductor_counter(conductor, "mooncake_conductor_reused_blocks_total") >= reused_before + 2,
                 "the long prompt scheduled", timeout=30)
        thaw.start()
        through(conductor, shared, 4, second)
    finally:
        thaw.cancel()
        os.killpg(p0.proc.pid, signal.SIGCONT)
    t.join(timeout=300)
    assert first.get("prefill") == "p0", "the long prompt goes where its prefix is"
    loaded = vllm_counter(p1.url, "vllm:external_prefix_cache_hits_total") - loaded_before
    return first, second, want["choices"][0]["token_ids"], loaded


def test_busy_holder_sends_the_prefix_through_the_store(engines, conductor):
    _, second, want, loaded = busy_holder(engines, conductor, seed=131)
    assert second["prefill"] == "p1", "the busy holder's prefix goes to the idle instance"
    assert second["tokens"] == want, "the same output as the holder's"
    assert loaded >= 2 * BLOCK, f"p1 loaded {loaded} prompt tokens through its connector, want the 2 blocks"


def test_without_pulls_the_busy_holder_keeps_its_prefix(engines, no_pulls):
    """The negative control: when the Conductor may not count a prefix as
    pulled from the store, recomputing it on p1 (296 tokens) costs more
    than waiting for p0 (128 queued, 40 new), so the shared prompt waits
    for the holder."""
    _, second, want, loaded = busy_holder(engines, no_pulls, seed=231)
    assert second["prefill"] == "p0"
    assert second["tokens"] == want


def conductor_counter(conductor: str, name: str) -> float:
    with urllib.request.urlopen(conductor + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] == name)

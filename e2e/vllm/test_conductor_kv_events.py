"""The Conductor on the engines' real cache state: two vLLM servers publish
their KV-cache events (--kv-events-config: ZeroMQ, msgpack BlockStored /
BlockRemoved, replay socket) and `mooncake conductor` follows them.

- Our block hashes are vLLM's: the conductor hashes a prompt's tokens
  itself (vllm:sha256, vLLM's default, 128-token blocks on CPU) and finds
  the blocks the engine published for it; the set of blocks the conductor
  holds for an engine is the set vLLM's own replay buffer describes.
- Routing follows them: a prompt whose prefix one engine holds goes there.
- A killed engine leaves the index within --kv-events-down-after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from vllm_harness import free_port, http_json, prompts, start_servers, stop_process, wait_line

BLOCK = 128  # vLLM's block size on CPU
DOWN_AFTER = 2  # seconds


def kv_events(pub: int, replay: int) -> list:
    # vLLM binds its PUB socket only for a wildcard endpoint (a host
    # connects it to a listening subscriber instead), so the publisher
    # listens on every interface; the replay socket is always bound, here
    # on loopback.
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
           "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    return ["--enable-prefix-caching", "--kv-events-config", json.dumps(cfg)]


@pytest.fixture(scope="module")
def engines(models, logs):
    """Two vLLM servers, a and b, publishing KV events; {name: (server,
    pub port, replay port)}."""
    ports = {n: (free_port(), free_port(), free_port()) for n in ("a", "b")}
    specs = [(n, models["a"], ports[n][0], logs / f"events-{n}.log", {"extra": kv_events(*ports[n][1:])})
             for n in ("a", "b")]
    servers = start_servers(specs)
    yield {s.name: (s, *ports[s.name][1:]) for s in servers}
    for s in servers:
        s.stop()


def start_conductor(mooncake_bin, engines, log, *extra, policy="local-cache-aware", decode="b", prefix="p"):
    """`mooncake conductor` with engines ({name: (server, pub port, replay
    port)}) as prefill instances named prefix+name following their events,
    and engine decode also as the decode instance (prefill there changes
    nothing that matters: it is where the routed prompts already are);
    extra goes on its command line. Returns (process, URL)."""
    args = [str(mooncake_bin), "conductor", "--listen", "127.0.0.1:0", "--admission", "none",
            "--policy", policy, "--block-hash", "vllm:sha256", "--block-size", str(BLOCK),
            "--model", "tiny", "--kv-events-down-after", f"{DOWN_AFTER}s", *extra]
    for n, (s, pub, rep) in engines.items():
        args += ["--prefill", f"{prefix}{n}={s.url},kv_events=tcp://127.0.0.1:{pub},kv_replay=tcp://127.0.0.1:{rep}"]
    args += ["--decode", f"d={engines[decode][0].url}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc, wait_line(log, "conductor listening", proc).split()[2]
    except BaseException:
        stop_process(proc, grace=5, group=True)
        raise


@pytest.fixture(scope="module")
def conductor(engines, mooncake_bin, logs):
    proc, url = start_conductor(mooncake_bin, engines, logs / "conductor-events.log")
    yield url
    stop_process(proc, grace=5, group=True)


@pytest.fixture(scope="module")
def wrong_seed(engines, mooncake_bin, logs):
    """The negative control: a conductor that hashes with another seed than
    the engines' (vLLM's PYTHONHASHSEED is unset there)."""
    proc, url = start_conductor(mooncake_bin, engines, logs / "conductor-wrong-seed.log", "--hash-seed", "1")
    yield url
    stop_process(proc, grace=5, group=True)


def complete(url: str, prompt: list) -> urllib.request.Request:
    return http_json(url + "/v1/completions",
                     {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0})


def query(conductor: str, prompt: list) -> dict:
    """The conductor's indexer answer for prompt: {instance: longest match}."""
    ans = http_json(conductor + "/query", {"model": "tiny", "block_size": BLOCK, "token_ids": prompt})
    return {inst: h["longest_matched"] for inst, h in ans.get("default", {}).items()}


def wait_for(cond, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.2)


def replayed_blocks(replay_port: int) -> set:
    """The blocks vLLM's own replay buffer says the engine holds: every
    batch since its start, BlockStored minus BlockRemoved, read with pyzmq
    and msgspec as any consumer would."""
    import msgspec
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(f"tcp://127.0.0.1:{replay_port}")
    try:
        s.send_multipart([b"", (0).to_bytes(8, "big")])
        held = set()
        while True:
            _, _, seq, payload = s.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) < 0:
                return held
            _, events, *_ = msgspec.msgpack.decode(payload)
            for e in events:
                if e["type"] == "BlockStored":
                    held.update(e["block_hashes"])
                elif e["type"] == "BlockRemoved":
                    held.difference_update(e["block_hashes"])
                elif e["type"] == "AllBlocksCleared":
                    held.clear()
    finally:
        s.close(linger=0)


def services(conductor: str) -> dict:
    with urllib.request.urlopen(conductor + "/services", timeout=10) as r:
        return {s["instance_id"]: s for s in json.loads(r.read())["services"]}


def test_our_block_hashes_are_vllms(engines, conductor, wrong_seed):
    x, other = prompts(2, length=300, seed=31)
    complete(engines["b"][0].url, x)
    # The conductor hashed x's tokens itself; it finds the 2 full blocks b
    # published, and none on a.
    got = wait_for(lambda: (q := query(conductor, x))["pb"] == 2 * BLOCK and q, "b's blocks of x in the index")
    assert got["pa"] == 0
    # A prompt that differs in its second block shares only the first.
    y = x[:BLOCK] + [t % 2000 + 3 for t in x[BLOCK:]]
    assert y[BLOCK:] != x[BLOCK:]
    assert query(conductor, y)["pb"] == BLOCK
    assert query(conductor, other)["pb"] == 0
    # What the conductor holds for b is exactly what vLLM's replay says.
    held = replayed_blocks(engines["b"][2])
    assert len(held) >= 2
    assert services(conductor)["pb"]["blocks"] == len(held)
    by_hash = http_json(conductor + "/query_by_hash",
                        {"model": "tiny", "block_size": BLOCK, "seq_hashes": sorted(held)[:1]})
    assert by_hash["default"]["pb"]["longest_matched"] == BLOCK
    # Negative control: hashed with another seed, the same tokens match
    # nothing, though that conductor holds the same blocks.
    wait_for(lambda: services(wrong_seed)["pb"]["blocks"] == len(held), "the blocks in the wrong-seed conductor")
    assert query(wrong_seed, x)["pb"] == 0


def routed_prefix(conductor: str, prompt: list, **extra) -> dict:
    """The router's longest cached prefix of prompt per holder, in blocks,
    hashed as a completion with extra (cache_salt, model) would be."""
    return http_json(conductor + "/v1/index/query", {"tokens": prompt, **extra})["prefix_blocks"]


def test_cache_salt_hashes_as_vllms(engines, conductor):
    """A request's cache_salt is in vLLM's hash of its blocks: the router
    hashes a salted prompt into the very blocks b published for it, and
    the same tokens without the salt, or with another, into none of them."""
    x = prompts(1, length=300, seed=77)[0]
    http_json(engines["b"][0].url + "/v1/completions",
              {"model": "tiny", "prompt": x, "max_tokens": 2, "temperature": 0, "cache_salt": "tenant-a"})
    wait_for(lambda: routed_prefix(conductor, x, cache_salt="tenant-a").get("pb") == 2,
             "b's salted blocks of x in the index")
    assert routed_prefix(conductor, x).get("pb", 0) == 0
    assert routed_prefix(conductor, x, cache_salt="tenant-b").get("pb", 0) == 0
    # The official indexer API hashes tokens without request extras: the
    # salted blocks are not the tokens' plain ones.
    assert query(conductor, x)["pb"] == 0


def test_routes_to_the_engine_holding_the_prefix(engines, conductor):
    on_a, on_b = prompts(2, length=290, seed=57)
    complete(engines["a"][0].url, on_a)
    complete(engines["b"][0].url, on_b)
    wait_for(lambda: query(conductor, on_a)["pa"] == 2 * BLOCK, "a's blocks")
    wait_for(lambda: query(conductor, on_b)["pb"] == 2 * BLOCK, "b's blocks")

    def route(prompt):
        req = urllib.request.Request(conductor + "/v1/completions", data=json.dumps(
            {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
            return r.headers["X-Conductor-Prefill"]

    # on_a first: its decode runs on b, which then holds on_a too.
    assert route(on_a) == "pa"
    for _ in range(3):
        assert route(on_b) == "pb"
    with urllib.request.urlopen(conductor + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'mooncake_conductor_kv_events_connected{dp_rank="0",instance="pb",type="vLLM"} 1' in metrics


def test_killed_engine_leaves_the_index(engines, conductor):
    x = prompts(1, length=260, seed=91)[0]
    complete(engines["a"][0].url, x)
    wait_for(lambda: query(conductor, x)["pa"] == 2 * BLOCK, "a's blocks")
    server = engines["a"][0]
    os.killpg(server.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: query(conductor, x)["pa"] == 0, "a's blocks gone", timeout=DOWN_AFTER + 20)
    assert time.monotonic() - killed < DOWN_AFTER + 10
    assert services(conductor)["pa"]["events"]["Resets"] >= 1
    assert services(conductor)["pb"]["blocks"] > 0, "b is untouched"

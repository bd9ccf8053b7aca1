"""Mooncake's architecture on this machine, with real vLLM: `make demo`.

- `mooncake up`: a master (publishing its KV events over ZMQ) and a
  storage node lending 512 MiB to the KV-cache pool;
- a prefill and a decode vLLM instance (the tiny local Llama), each with
  our connector (MooncakeGoConnector: prefill-to-decode transfer and the
  store tier) and publishing its own KV-cache events;
- `mooncake conductor` in front, routing on those events.

It replays short multi-turn conversations (a shared system prompt; each
turn's prompt is the previous one, its answer and new user tokens) and
prints, per request, the instances chosen, the prompt tokens the prefill
instance could reuse (in its own cache, in the store, or none: the
Conductor's index just before the request) and the time to first token
through the Conductor. Halfway, the prefill instance is restarted: its
local cache is gone, the store still has every block it saved, and the
next turns reuse them from there.

Run with the vLLM suite's venv: `make demo` (e2e/py.sh vllm e2e/vllm/demo.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "python" / "tests")]

import tinymodel  # noqa: E402
from mccluster import field, free_port, start_cluster, stop_process  # noqa: E402
from vllm_harness import http_json, start_servers, wait_line  # noqa: E402

BLOCK = 128  # vLLM's block size on CPU
MAX_LEN = 1024


def connector(master: str) -> dict:
    return {"kv_connector": "MooncakeGoConnector", "kv_connector_module_path": "mooncake_go.connectors.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master": master, "host": "127.0.0.1"}}


def events_args(pub: int, replay: int) -> list:
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
           "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    return ["--enable-prefix-caching", "--kv-events-config", json.dumps(cfg), "--max-model-len", str(MAX_LEN)]


def conversations(n: int, turns: int, rng: random.Random) -> list:
    """n conversations of turns user messages each: (system prompt shared by
    all, [user token lists])."""
    system = [rng.randrange(3, tinymodel.VOCAB) for _ in range(2 * BLOCK)]
    return [(system, [[rng.randrange(3, tinymodel.VOCAB) for _ in range(rng.randrange(90, 160))]
                      for _ in range(turns)]) for _ in range(n)]


def stream(url: str, prompt: list, max_tokens: int) -> tuple:
    """Streams a completion through the Conductor; returns (TTFT s, output
    token ids, prefill instance, decode instance)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    ttft, out = None, []
    with urllib.request.urlopen(req, timeout=300) as r:
        prefill, decode = r.headers["X-Conductor-Prefill"], r.headers["X-Conductor-Decode"]
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if "error" in ev:
                raise RuntimeError(f"the Conductor answered an error: {ev['error']}")
            if ttft is None:
                ttft = time.monotonic() - start
            for c in ev.get("choices", []):
                out += c.get("token_ids") or []
    return ttft, out, prefill, decode


def reuse(conductor: str, prompt: list, prefill: str) -> tuple:
    """(local, store, none) prompt tokens by the Conductor's index now:
    leading blocks the prefill instance holds, further ones the store holds,
    the rest."""
    ans = http_json(conductor + "/v1/index/query", {"tokens": prompt})
    blocks = ans["prefix_blocks"]
    local = blocks.get(prefill, 0) * BLOCK
    store = max(0, blocks.get("store", 0) * BLOCK - local)
    return local, store, len(prompt) - local - store


def vllm_hits(url: str) -> tuple:
    """vLLM's own counters: (prompt tokens found in its prefix cache, found
    by its KV connector), as its /metrics has them."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {"vllm:prefix_cache_hits_total": 0.0, "vllm:external_prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in got:
            got[name] += float(line.rsplit(" ", 1)[1])
    return int(got["vllm:prefix_cache_hits_total"]), int(got["vllm:external_prefix_cache_hits_total"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--restart-after", type=int, default=2, help="restart the prefill instance after this turn (0: never)")
    ap.add_argument("--logs", type=Path, default=None, help="where the servers log [a temporary directory]")
    args = ap.parse_args()
    bin_ = Path(__import__("os").environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))
    logs = args.logs or Path(tempfile.mkdtemp(prefix="mooncake-demo-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs: {logs}", flush=True)

    cleanup = []
    try:
        t0 = time.monotonic()
        cluster = start_cluster(bin_, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB",
                                "--enable_kv_events", "--kv_events_bind_endpoint", "tcp://127.0.0.1:0",
                                "--kv_events_replay_endpoint", "tcp://127.0.0.1:0")
        cleanup.append(cluster.stop)
        mline = next(line for line in cluster.lines if line.startswith("master") and "kv_events=" in line)
        store_events, store_replay = field(mline, "kv_events"), field(mline, "kv_events_replay")
        print(f"store: master {cluster.master}, KV events {store_events}", flush=True)

        model = tinymodel.write(logs / "model" / "tiny", seed=1)
        ports = {n: (free_port(), free_port(), free_port()) for n in ("p0", "d0")}

        def spec(name):
            return (name, model, ports[name][0], logs / f"{name}.log",
                    {"kv": connector(cluster.master), "extra": events_args(*ports[name][1:])})

        print("starting the prefill and decode vLLM instances ...", flush=True)
        servers = {s.name: s for s in start_servers([spec("p0"), spec("d0")])}
        cleanup.append(lambda: [s.stop() for s in servers.values()])
        kv = {n: f"kv_events=tcp://127.0.0.1:{ports[n][1]},kv_replay=tcp://127.0.0.1:{ports[n][2]}" for n in ports}
        clog = logs / "conductor.log"
        with open(clog, "w") as out:
            cproc = subprocess.Popen(
                [str(bin_), "conductor", "--listen", "127.0.0.1:0", "--admission", "none",
                 "--block-hash", "vllm:sha256", "--block-size", str(BLOCK), "--model", "tiny",
                 "--store-kv-events", store_events, "--store-kv-replay", store_replay,
                 "--prefill", f"p0={servers['p0'].url},{kv['p0']}", "--decode", f"d0={servers['d0'].url},{kv['d0']}"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        cleanup.append(lambda: stop_process(cproc, grace=5, group=True))
        conductor = wait_line(clog, "conductor listening", cproc).split()[2]
        print(f"conductor: {conductor}  (up in {time.monotonic() - t0:.0f} s)\n", flush=True)

        convs = conversations(args.conversations, args.turns, random.Random(5))
        history = [list(system) for system, _ in convs]
        rows = []
        before = [0, 0]  # vLLM's counters of the prefill processes already stopped
        hdr = f"{'conv':>4} {'turn':>4} {'prompt':>6}  {'prefill':>7} {'decode':>6}  {'local':>5} {'store':>5} {'none':>5}  {'TTFT ms':>8}"
        print(hdr)
        print("-" * len(hdr))
        for turn in range(args.turns):
            if args.restart_after and turn == args.restart_after:
                print("-- restarting the prefill instance: its local cache is gone, the store keeps the blocks", flush=True)
                before = [a + b for a, b in zip(before, vllm_hits(servers["p0"].url))]
                servers["p0"].stop()
                servers["p0"] = start_servers([spec("p0")])[0]
                time.sleep(1)  # the Conductor resubscribes (its retry is 200 ms)
            for c, (_, users) in enumerate(convs):
                prompt = history[c] + users[turn]
                if len(prompt) + args.max_tokens > MAX_LEN:
                    continue
                local, store, none = reuse(conductor, prompt, "p0")
                ttft, out, p, d = stream(conductor, prompt, args.max_tokens)
                history[c] = prompt + out
                rows.append((c, turn, len(prompt), p, d, local, store, none, ttft))
                print(f"{c:>4} {turn:>4} {len(prompt):>6}  {p:>7} {d:>6}  {local:>5} {store:>5} {none:>5}  {ttft * 1e3:>8.1f}", flush=True)

        print("\nsummary")
        print(f"{'turn':>4} {'requests':>8} {'reused local':>12} {'reused store':>12} {'computed':>8} {'TTFT ms (median)':>16}")
        for turn in range(args.turns):
            rs = [r for r in rows if r[1] == turn]
            if rs:
                print(f"{turn:>4} {len(rs):>8} {sum(r[5] for r in rs):>12} {sum(r[6] for r in rs):>12} "
                      f"{sum(r[7] for r in rs):>8} {statistics.median(r[8] for r in rs) * 1e3:>16.1f}")
        total = sum(r[2] for r in rows)
        reused = sum(r[5] + r[6] for r in rows)
        local, external = [a + b for a, b in zip(before, vllm_hits(servers["p0"].url))]
        print(f"\n{len(rows)} requests, {total} prompt tokens, {reused} reused by the Conductor's index "
              f"({100 * reused / max(total, 1):.0f}%); the prefill vLLM counted {local} tokens from its own "
              f"prefix cache and {external} loaded by the connector; demo took {time.monotonic() - t0:.0f} s")
        return 0
    finally:
        for f in reversed(cleanup):
            try:
                f()
            except Exception as e:  # keep stopping the rest
                print(f"cleanup: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

"""Time to first token with real vLLM on this machine: `make bench-vllm`.

Same model (the tiny local Llama, with room for 4k-token prompts), same
prompts, same run, medians of --repeat requests per point:

- disaggregated serving behind `mooncake conductor`, from the request to
  the first decoded token: our connector (MooncakeGoConnector) vs vLLM's
  built-in MooncakeConnector on our package, each a prefill and a decode
  vLLM instance, both deployments up at once and their requests taking
  turns; and no disaggregation (one instance alone, streamed directly);
- the store tier: a prompt prefilled once on instance A (which saves its
  blocks to Mooncake Store), then sent to instance B, which loads them from
  the store, vs a prompt B has to compute (a store miss), on the same B.

The figures are this machine's (2 CPU cores, a 2-layer model): every
running vLLM instance keeps a core busy, so with several up each request
waits for CPU, and transfers and HTTP hops weigh much more than a real
model's prefill would. Compare figures of one part with each other only.
Results go to --out as JSON, and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
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
from mccluster import free_port, start_cluster, stop_process  # noqa: E402
from vllm_harness import start_servers, wait_line  # noqa: E402

MAX_LEN = 4608


def ours(master: str | None = None) -> dict:
    extra = {"host": "127.0.0.1"}
    if master:
        extra["master"] = master
    return {"kv_connector": "MooncakeGoConnector", "kv_connector_module_path": "mooncake_go.connectors.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


def builtin(role: str, engine_id: str) -> dict:
    return {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": engine_id,
            "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}


def ttft(url: str, prompt: list) -> float:
    """Seconds from the request to the first streamed token."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                if "error" in json.loads(line[5:]):
                    raise RuntimeError(f"{url}: {line}")
                return time.monotonic() - start
    raise RuntimeError(f"{url}: no token streamed")


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = Path(os.environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))
        self.logs = args.logs or Path(tempfile.mkdtemp(prefix="mooncake-bench-vllm-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.model = tinymodel.write(self.logs / "model" / "tiny", seed=1, max_positions=MAX_LEN + 64)
        self.rng = random.Random(11)
        self.results = {}

    def prompt(self, n: int) -> list:
        return [self.rng.randrange(3, tinymodel.VOCAB) for _ in range(n)]

    def servers(self, specs: list) -> list:
        full = []
        for name, kv, env in specs:
            opts = {"extra": ["--max-model-len", str(MAX_LEN)]}
            if kv is not None:
                opts["kv"] = kv
            if env:
                opts["env"] = env
            full.append((name, self.model, free_port(), self.logs / f"{name}.log", opts))
        return start_servers(full)

    def conductor(self, name: str, prefill: str, decode: str) -> tuple:
        log = self.logs / f"conductor-{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([str(self.bin), "conductor", "--listen", "127.0.0.1:0", "--admission", "none",
                                     "--prefill", prefill, "--decode", decode],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc, wait_line(log, "conductor listening", proc).split()[2]
        except BaseException:
            stop_process(proc, grace=5, group=True)
            raise

    def measure(self, name: str, url: str, lengths: list) -> None:
        ttft(url, self.prompt(256))  # warm-up
        for n in lengths:
            xs = [ttft(url, self.prompt(n)) for _ in range(self.args.repeat)]
            self.results.setdefault(name, {})[n] = statistics.median(xs)
            print(f"  {name:<10} {n:>5} tokens: TTFT median {statistics.median(xs) * 1e3:7.1f} ms "
                  f"(min {min(xs) * 1e3:.1f}, max {max(xs) * 1e3:.1f})", flush=True)

    def pd(self) -> None:
        """Both disaggregated deployments up at once, each a prefill and a
        decode instance behind its own conductor, their requests taking
        turns: the machine's drift and the other processes' load weigh on
        both alike."""
        boot = free_port()
        env = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)}
        servers = self.servers([("builtin-p", builtin("kv_producer", "builtin-p"), env),
                                ("builtin-d", builtin("kv_consumer", "builtin-d"), None),
                                ("ours-p", ours(), None), ("ours-d", ours(), None)])
        procs = []
        try:
            bp, bd, op, od = servers
            proc, burl = self.conductor("builtin", f"p={bp.url},engine_id=builtin-p,bootstrap_addr=http://127.0.0.1:{boot}",
                                        f"d={bd.url}")
            procs.append(proc)
            proc, ourl = self.conductor("ours", f"p={op.url}", f"d={od.url}")
            procs.append(proc)
            urls = {"builtin": burl, "ours": ourl}
            for url in urls.values():
                ttft(url, self.prompt(256))  # warm-up
            for n in self.args.lengths:
                xs = {k: [] for k in urls}
                for _ in range(self.args.repeat):
                    for k, url in urls.items():
                        xs[k].append(ttft(url, self.prompt(n)))
                for k, v in xs.items():
                    self.results.setdefault(k, {})[n] = statistics.median(v)
                print(f"  PD {n:>5} tokens: builtin {statistics.median(xs['builtin']) * 1e3:7.1f} ms, "
                      f"ours {statistics.median(xs['ours']) * 1e3:7.1f} ms "
                      f"(ranges {min(xs['builtin']) * 1e3:.0f}-{max(xs['builtin']) * 1e3:.0f}, "
                      f"{min(xs['ours']) * 1e3:.0f}-{max(xs['ours']) * 1e3:.0f})", flush=True)
        finally:
            for proc in procs:
                stop_process(proc, grace=5, group=True)
            for s in servers:
                s.stop()

    def single(self) -> None:
        (s,) = self.servers([("single", None, None)])
        try:
            self.measure("single", s.url, self.args.lengths)
        finally:
            s.stop()

    def store_tier(self) -> None:
        cluster = start_cluster(self.bin, "--no-ha", "--nodes", "1", "--global_segment_size", "1GiB", admin=True)
        try:
            a, b = self.servers([("store-a", ours(cluster.master), None), ("store-b", ours(cluster.master), None)])
            try:
                ttft(b.url, self.prompt(256))
                for n in self.args.lengths:
                    hit, miss = [], []
                    for _ in range(self.args.repeat):
                        x = self.prompt(n)
                        ttft(a.url, x)  # a computes x and saves its blocks
                        self.wait_saved(cluster, n)
                        hit.append(ttft(b.url, x))
                        miss.append(ttft(b.url, self.prompt(n)))
                    for name, xs in (("store-hit", hit), ("recompute", miss)):
                        self.results.setdefault(name, {})[n] = statistics.median(xs)
                    print(f"  store tier {n:>5} tokens: loaded {statistics.median(hit) * 1e3:7.1f} ms, "
                          f"computed {statistics.median(miss) * 1e3:7.1f} ms", flush=True)
            finally:
                a.stop()
                b.stop()
        finally:
            cluster.stop()

    def wait_saved(self, cluster, n: int, timeout: float = 30) -> None:
        """Waits until the store holds at least the full blocks of the last
        prompt (the connector saves in the background)."""
        want = getattr(self, "_keys", 0) + n // 128
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/get_all_keys", timeout=10) as r:
                count = len(r.read().decode().split())
            if count >= want:
                self._keys = count
                return
            time.sleep(0.05)
        raise RuntimeError(f"the store did not get {want} keys in {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048, 4096])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "vllm-ttft.json")
    ap.add_argument("--logs", type=Path, default=None)
    ap.add_argument("--only", default="single,pd,store", help="which parts to run")
    args = ap.parse_args()
    b = Bench(args)
    print(f"logs: {b.logs}", flush=True)
    parts = args.only.split(",")
    if "single" in parts:
        b.single()
    if "pd" in parts:
        b.pd()
    if "store" in parts:
        b.store_tier()

    r = b.results
    print(f"\n{'tokens':>6}  " + "  ".join(f"{k:>10}" for k in r) + "   (TTFT median, ms)")
    for n in args.lengths:
        print(f"{n:>6}  " + "  ".join(f"{r[k].get(n, float('nan')) * 1e3:>10.1f}" for k in r))
    ratios = {}
    for n in args.lengths:
        row = {}
        if "ours" in r and "builtin" in r:
            row["ours/builtin"] = r["ours"][n] / r["builtin"][n]
        if "ours" in r and "single" in r:
            row["ours/single"] = r["ours"][n] / r["single"][n]
        if "store-hit" in r:
            row["store-hit/recompute"] = r["store-hit"][n] / r["recompute"][n]
        ratios[n] = row
        print(f"{n:>6}  " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"ttft_s": {k: {str(n): v for n, v in d.items()} for k, d in r.items()},
                                    "ratios": {str(n): v for n, v in ratios.items()},
                                    "repeat": args.repeat}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

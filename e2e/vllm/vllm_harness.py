"""The vLLM suite's harness: vLLM OpenAI servers in their own process groups,
the offline runner, the prompts and HTTP helpers."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import tinymodel  # this directory and python/tests are on sys.path (the conftests)
from mccluster import free_port, stop_process  # noqa: F401 (free_port: for the tests)

HERE = Path(__file__).resolve().parent

MAX_TOKENS = 16
START_TIMEOUT = 420  # an engine starts in 16-38 s alone; several at once on 2 cores take longer
# vLLM engine arguments added to every engine, as a JSON object: what a GPU
# host needs (scripts/gpu-vllm.sh), e.g. {"block_size": 128,
# "gpu_memory_utilization": 0.05} (the CPU's block size; several engines
# sharing one GPU). run_llm.py reads the same variable.
ENGINE_ARGS = json.loads(os.environ.get("MOONCAKE_E2E_VLLM_ENGINE_ARGS") or "{}")
# Where the vLLM processes put their ZMQ sockets (VLLM_RPC_BASE_PATH, else
# the temp directory): a process stopped with SIGKILL leaves them, dozens
# a run, so they go in a directory of this run's, removed when it ends.
RPC_DIR = tempfile.mkdtemp(prefix="mooncake-e2e-vllm-rpc-")
atexit.register(shutil.rmtree, RPC_DIR, True)


def vllm_env(**extra: str) -> dict:
    """The environment of every vLLM process: no hub, a small CPU KV cache,
    the harness's CPU workaround (cpu_workaround/sitecustomize.py) and this
    run's directory for its sockets."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        MOONCAKE_E2E_CPU_WORKAROUND="1",
        VLLM_RPC_BASE_PATH=RPC_DIR,
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE / "cpu_workaround"), env.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def prompts(n: int = 4, length: int = 160, seed: int = 7) -> list:
    """n random prompts of token ids (no special tokens), each longer than one
    128-token block (the store connector saves only full blocks)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, tinymodel.VOCAB) for _ in range(length + 17 * i)] for i in range(n)]


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def http_stream(url: str, body: dict, timeout: float = 120) -> list:
    """The JSON events of a server-sent-events response, up to [DONE]."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events


class Server:
    """One vLLM OpenAI API server (python -m vllm.entrypoints.openai.api_server;
    the `vllm serve` entry point looks up a distribution named vllm, and this
    one is vllm-cpu) in its own process group, logging to a file."""

    def __init__(self, name: str, model: Path, port: int, log: Path, kv: dict | None = None,
                 env: dict | None = None, extra: list | None = None):
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
                "--enforce-eager", "--seed", "0", "--no-enable-prefix-caching",
                "--kv-cache-memory-bytes", str(64 << 20)]
        for k, v in ENGINE_ARGS.items():
            flag = k.replace("_", "-")
            if isinstance(v, bool):
                args.append(f"--{flag}" if v else f"--no-{flag}")
            else:
                args += [f"--{flag}", json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
        if kv is not None:
            args += ["--kv-transfer-config", json.dumps(kv)]
        args += extra or []  # later flags win (--enable-prefix-caching, say)
        self.name, self.port, self.log = name, port, log
        self.url = f"http://127.0.0.1:{port}"
        self._logf = open(log, "w")
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT,
                                     env=vllm_env(**(env or {})), start_new_session=True)

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server {self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM server {self.name} not ready in {START_TIMEOUT} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        self._logf.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        # The whole group: vLLM's engine and worker processes included.
        stop_process(self.proc, group=True)
        self._logf.close()


def wait_line(log: Path, prefix: str, proc: subprocess.Popen, timeout: float = 30) -> str:
    """The first line of log that starts with prefix, once the process that
    writes it has written it."""
    deadline = time.monotonic() + timeout
    while True:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {prefix!r} line from {proc.args[:2]} (exit {proc.poll()}):\n"
                               + log.read_text(errors="replace")[-3000:])
        time.sleep(0.1)


def start_servers(specs: list) -> list:
    """Starts every server of specs (Server argument tuples) at once and waits
    for all; on any failure stops them all."""
    servers = []
    try:
        for spec in specs:
            servers.append(Server(*spec[:4], **spec[4] if len(spec) > 4 else {}))
        deadline = time.monotonic() + START_TIMEOUT
        for s in servers:
            s.wait_ready(deadline)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def run_offline(model: Path, prompt_ids: list, log: Path, kv: dict | None = None,
                env: dict | None = None, wait_keys: dict | None = None,
                timeout: float = START_TIMEOUT) -> list:
    """Greedy tokens of each prompt from one offline vLLM engine (run_llm.py in
    a process group of its own); kv is its kv_transfer_config, wait_keys what
    the store must hold before it exits (see run_llm.py)."""
    spec = {"model": str(model), "prompts": prompt_ids, "max_tokens": MAX_TOKENS, "kv": kv,
            "wait_keys": wait_keys}
    out = log.with_suffix(".json")
    with open(log, "w") as logf:
        proc = subprocess.Popen([sys.executable, str(HERE / "run_llm.py"), json.dumps(spec), str(out)],
                                stdout=logf, stderr=subprocess.STDOUT, env=vllm_env(**(env or {})),
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            stop_process(proc, grace=5, group=True)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"offline vLLM run failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out.read_text())

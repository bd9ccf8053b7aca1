"""vLLM's own MooncakeConnector (P2P KV transfer: the prefill instance writes
its KV blocks into the decode instance's through mooncake.engine) on our
package, between separate vLLM server processes, and the same online behind
`mooncake conductor`.

Servers: D decodes (model a, kv_consumer); PA prefills with the same weights;
PB prefills with the other weights (model b). D's answers equal a
single-instance run of model a when PA prefilled, and differ when PB did: D
decoded from the KV cache it received, not from its own recomputation."""

from __future__ import annotations

import itertools
import subprocess

import pytest
from vllm_harness import (MAX_TOKENS, free_port, http_json, http_stream, prompts, start_servers, stop_process,
                          wait_line)
from tinymodel import text

_ids = itertools.count(1)


def connector(role: str, engine_id: str) -> dict:
    return {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": engine_id,
            "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}


@pytest.fixture(scope="module")
def pd(models, logs):
    ports = {n: free_port() for n in ("d", "pa", "pb", "boot_a", "boot_b")}
    servers = start_servers([
        ("d", models["a"], ports["d"], logs / "d.log", {"kv": connector("kv_consumer", "d")}),
        ("pa", models["a"], ports["pa"], logs / "pa.log",
         {"kv": connector("kv_producer", "pa"), "env": {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(ports["boot_a"])}}),
        ("pb", models["b"], ports["pb"], logs / "pb.log",
         {"kv": connector("kv_producer", "pb"), "env": {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(ports["boot_b"])}}),
    ])
    d, pa, pb = servers
    pa.bootstrap = f"http://127.0.0.1:{ports['boot_a']}"
    pb.bootstrap = f"http://127.0.0.1:{ports['boot_b']}"
    yield {"d": d, "pa": pa, "pb": pb}
    for s in servers:
        s.stop()


def completion(url: str, prompt, max_tokens: int = MAX_TOKENS, kv: dict | None = None) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    if kv is not None:
        body["kv_transfer_params"] = kv
    return http_json(url + "/v1/completions", body)["choices"][0]


def decoded(choice: dict):
    """The generated token ids where the server returns them, else the text."""
    return choice.get("token_ids") or choice["text"]


@pytest.fixture(scope="module")
def baseline(pd):
    """A single-instance run: D on its own (no kv_transfer_params: the
    connector has nothing to load and D computes the prompt itself)."""
    return [decoded(completion(pd["d"].url, p)) for p in prompts()]


def disaggregated(pd, prefill) -> list:
    """Each prompt prefilled on `prefill` (max_tokens 1, do_remote_decode),
    then decoded on D from the KV that prefill wrote into D's blocks."""
    out = []
    for p in prompts():
        xfer = f"xfer-{next(_ids)}"
        completion(prefill.url, p, max_tokens=1,
                   kv={"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer})
        out.append(decoded(completion(pd["d"].url, p, kv={
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": prefill.name,
            "remote_bootstrap_addr": prefill.bootstrap, "transfer_id": xfer})))
    return out


def test_decode_from_transferred_kv_equals_single_instance(pd, baseline):
    assert disaggregated(pd, pd["pa"]) == baseline


def test_negative_control_other_weights_prefill_differs(pd, baseline):
    got = disaggregated(pd, pd["pb"])
    assert all(g != b for g, b in zip(got, baseline)), "decode ignored the KV it was sent"


@pytest.fixture(scope="module")
def conductors(pd, mooncake_bin, logs):
    """Two `mooncake conductor` routers in front of D: one with PA as its
    prefill instance, one with PB (the negative control)."""
    urls, procs = {}, []
    try:
        for name in ("pa", "pb"):
            p = pd[name]
            log = logs / f"conductor-{name}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(
                    [str(mooncake_bin), "conductor", "--listen", "127.0.0.1:0",
                     "--prefill", f"{name}={p.url},engine_id={name},bootstrap_addr={p.bootstrap}",
                     "--decode", f"d={pd['d'].url}", "--admission", "none"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            # "conductor listening http://127.0.0.1:PORT prefill=1 decode=1"
            urls[name] = wait_line(log, "conductor listening", proc).split()[2]
        yield urls
    finally:
        for proc in procs:
            stop_process(proc, grace=5, group=True)


def chat_text(choice: dict) -> str:
    return choice["message"]["content"]


def online(url: str, kind: str, stream: bool, prompt_ids: list) -> str:
    """The text of one request through the OpenAI API at url."""
    body = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if kind == "completions":
        body["prompt"] = text(prompt_ids)
    else:
        body["messages"] = [{"role": "user", "content": text(prompt_ids)}]
    path = f"{url}/v1/{kind}"
    if not stream:
        choice = http_json(path, body)["choices"][0]
        return choice["text"] if kind == "completions" else chat_text(choice)
    parts = []
    for ev in http_stream(path, body):
        for c in ev.get("choices", []):
            parts.append(c.get("text") if kind == "completions" else c.get("delta", {}).get("content"))
    return "".join(p for p in parts if p)


@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_online_behind_conductor_equals_baseline(pd, conductors, kind, stream):
    ps = prompts(n=2)
    want = [online(pd["d"].url, kind, False, p) for p in ps]
    assert all(want), "the baseline produced no text"
    assert [online(conductors["pa"], kind, stream, p) for p in ps] == want
    # Negative control: the same route with the other weights' prefill.
    got = [online(conductors["pb"], kind, stream, p) for p in ps]
    assert all(g != w for g, w in zip(got, want)), "decode ignored the KV it was sent"

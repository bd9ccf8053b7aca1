"""vLLM's own MooncakeStoreConnector (full KV blocks shared through Mooncake
Store) on our package against a real `mooncake up`: a writer instance
computes the prompts and saves their blocks; a second instance, a fresh
process, loads them from the store instead of computing them. Its answers
equal a single-instance run, the master's metrics show the puts and the gets,
and when the writer had the other weights the reader's answers differ."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request

import pytest
from mccluster import Cluster, field, start_cluster, start_real_client, stop_process
from vllm_harness import prompts, run_offline



def store_connector(cluster) -> dict:
    """vLLM's kv_transfer_config for the connector. Blocks go to the storage
    node of `mooncake up` (preferred_segment): each vLLM instance also lends
    the pool a segment of its own (embedded mode requires one), and blocks
    placed there leave with the instance, as in Mooncake, while this test's
    writer exits before the reader starts."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/get_all_segments", timeout=10) as r:
        nodes = r.read().decode().split()
    assert len(nodes) == 1, f"expected the one storage node of mooncake up, got {nodes}"
    return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"preferred_segment": nodes[0]}}

BLOCK = 128  # vLLM's KV block on the CPU: only full blocks are stored


def store_env(cluster, tmp_path, mode: str = "embedded") -> dict:
    """The connector's configuration, as vLLM reads it: a JSON file named by
    MOONCAKE_CONFIG_PATH. In standalone-store mode the ranks lend no
    memory (global_segment_size 0): a mooncake_client process owns the pool."""
    cfg = tmp_path / f"mooncake-{cluster.proc.pid}.json"
    cfg.write_text(json.dumps({
        "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": cluster.master, "protocol": "tcp", "device_name": "",
        "global_segment_size": "64MB" if mode == "embedded" else 0, "local_buffer_size": "64MB", "mode": mode,
    }))
    return {"MOONCAKE_CONFIG_PATH": str(cfg)}


def saved_blocks(cluster) -> dict:
    """What a writer waits for before it exits: every full block of the
    prompts in the store (run_llm.py's wait_keys)."""
    full = sum(len(p) // BLOCK for p in prompts())
    return {"url": f"http://127.0.0.1:{cluster.metrics_port}/get_all_keys", "count": full, "timeout": 60}


def metrics(cluster) -> dict:
    """The master's counters and gauges by name (labels summed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10) as r:
        body = r.read().decode()
    out: dict = {}
    for line in body.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def family(m: dict, pattern: str) -> float:
    return sum(v for k, v in m.items() if re.fullmatch(pattern, k))


PUTS = r"master_(batch_)?put_start_items_total|master_put_start_requests_total"
GETS = r"master_batch_get_replica_list_items_total|master_get_replica_list_requests_total"


@pytest.fixture(scope="module")
def baseline(models, logs):
    return run_offline(models["a"], prompts(), logs / "baseline.log")


def test_reader_loads_blocks_written_by_another_instance(models, logs, cluster, tmp_path, baseline):
    env, kv = store_env(cluster, tmp_path), store_connector(cluster)
    before = metrics(cluster)
    # The writer exits only once every full block is in the store.
    wrote = run_offline(models["a"], prompts(), logs / "store-writer.log", kv=kv, env=env,
                        wait_keys=saved_blocks(cluster))
    after_write = metrics(cluster)
    assert wrote == baseline, "the writer (nothing in the store yet) must answer as a plain instance"
    assert family(after_write, PUTS) > family(before, PUTS), "the writer saved no block"

    read = run_offline(models["a"], prompts(), logs / "store-reader.log", kv=kv, env=env)
    after_read = metrics(cluster)
    assert read == baseline
    assert family(after_read, GETS) > family(after_write, GETS), "the reader fetched no block"


def test_negative_control_blocks_of_other_weights_change_the_answer(models, logs, mooncake_bin, tmp_path,
                                                                   baseline):
    """The same keys (same model directory name, same prompts) written by the
    other weights: a reader that really loads them answers differently."""
    other = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB", admin=True)
    try:
        env, kv = store_env(other, tmp_path), store_connector(other)
        run_offline(models["b"], prompts(), logs / "neg-writer.log", kv=kv, env=env,
                    wait_keys=saved_blocks(other))
        read = run_offline(models["a"], prompts(), logs / "neg-reader.log", kv=kv, env=env)
        assert all(r != b for r, b in zip(read, baseline)), "the reader ignored the blocks in the store"
    finally:
        other.stop()


def segments(cluster) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/get_all_segments", timeout=10) as r:
        return r.read().decode().split()


@pytest.fixture(scope="module")
def bare_master(mooncake_bin):
    """``mooncake master`` alone, no storage node, with its admin port."""
    proc = subprocess.Popen([str(mooncake_bin), "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0",
                             "--metrics_port", "0", "--metrics_host", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("master listening"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block on a full pipe
            c = Cluster(proc, field(line, "rpc"), lines, admin=field(line, "admin"))
            yield c
            stop_process(proc)
            return
    stop_process(proc)
    raise RuntimeError("mooncake master exited before listening:\n" + "\n".join(lines[-20:]))


def test_standalone_store_mode(models, logs, mooncake_bin, bare_master, tmp_path, baseline):
    """vLLM's ``mode: standalone-store``: the instances lend no memory; a
    mooncake_client process (our `mooncake client`) owns the pool. A writer
    saves its blocks there, a fresh reader loads them, and the pool's only
    segment is the real client's throughout."""
    real = start_real_client(mooncake_bin, bare_master.master, segment="256MiB")
    try:
        pool = segments(bare_master)
        assert len(pool) == 1, f"the real client's segment alone, got {pool}"
        env = store_env(bare_master, tmp_path, mode="standalone-store")
        kv = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
        before = metrics(bare_master)
        wrote = run_offline(models["a"], prompts(), logs / "standalone-writer.log", kv=kv, env=env,
                            wait_keys=saved_blocks(bare_master))
        assert wrote == baseline
        after_write = metrics(bare_master)
        assert family(after_write, PUTS) > family(before, PUTS), "the writer saved no block"
        read = run_offline(models["a"], prompts(), logs / "standalone-reader.log", kv=kv, env=env)
        assert read == baseline
        assert family(metrics(bare_master), GETS) > family(after_write, GETS), "the reader fetched no block"
        assert segments(bare_master) == pool, "an instance lent the pool memory in standalone-store mode"
    finally:
        real.stop()

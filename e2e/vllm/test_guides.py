"""The official vLLM MooncakeStoreConnector guides' deployment, replayed on
our package: the master started by the installed ``mooncake_master``
console script with the guides' flags (vLLM's ``--port``, the deprecated
name of the RPC port, and Mooncake's --enable_http_metadata_server=true),
the JSON config the guides write and name by MOONCAKE_CONFIG_PATH
(master_server_address, metadata_server at the master's own /metadata,
global_segment_size, local_buffer_size, protocol, device_name "", mode
embedded), then vLLM's own MooncakeStoreConnector starting against it in
an offline engine on CPU.

Changes to the commands as written: the ports (free ones, given with the
official flags, instead of 50051 and 8080, which other suites on a shared
machine may hold), protocol tcp and small sizes (the guides write rdma and
80GB/4GB for GPU hosts), and one flag the guides do not give,
--metrics_port, to read the master's keys and counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from mccluster import field, free_port, stop_process
from test_mooncake_store_connector import BLOCK, PUTS, family, metrics
from vllm_harness import prompts, run_offline

SCRIPTS = Path(sys.executable).parent


class GuideMaster:
    """`mooncake_master --port P --enable_http_metadata_server=true
    --http_metadata_server_port H` through the installed console script
    (the bundled command, not a MOONCAKE_BIN of the suite's)."""

    def __init__(self):
        self.rpc, self.meta, self.metrics_port = free_port(), free_port(), free_port()
        env = dict(os.environ)
        env.pop("MOONCAKE_BIN", None)
        self.proc = subprocess.Popen(
            [str(SCRIPTS / "mooncake_master"), f"--port={self.rpc}", "--enable_http_metadata_server=true",
             f"--http_metadata_server_port={self.meta}", f"--metrics_port={self.metrics_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if line.startswith("master listening"):
                break
        else:
            self.stop()
            pytest.fail("mooncake_master exited before listening:\n" + "".join(lines[-30:]))
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        assert field(line, "rpc").endswith(f":{self.rpc}"), f"--port sets the RPC port: {line}"
        self.master = f"127.0.0.1:{self.rpc}"
        self.metadata = f"http://127.0.0.1:{self.meta}/metadata"

    def stop(self) -> None:
        stop_process(self.proc, group=True)


@pytest.fixture
def guide_master():
    m = GuideMaster()
    yield m
    m.stop()


def guide_config(m: GuideMaster, tmp_path: Path) -> dict:
    """The guides' JSON config, named by MOONCAKE_CONFIG_PATH."""
    cfg = tmp_path / "mooncake_config.json"
    cfg.write_text(json.dumps({
        "mode": "embedded", "local_hostname": "127.0.0.1", "metadata_server": m.metadata,
        "master_server_address": m.master, "global_segment_size": "256MB", "local_buffer_size": "64MB",
        "protocol": "tcp", "device_name": "",
    }))
    return {"MOONCAKE_CONFIG_PATH": str(cfg)}


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_store_connector_guide_deployment(models, logs, guide_master, tmp_path):
    """vLLM's MooncakeStoreConnector, configured as the guides say, starts
    against the guides' master: its store client publishes its segment in
    the master's in-process HTTP metadata server, and every full block of
    the prompts reaches the store."""
    m = guide_master
    kv = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    full = sum(len(p) // BLOCK for p in prompts())
    wait = {"url": f"http://127.0.0.1:{m.metrics_port}/get_all_keys", "count": full, "timeout": 120}
    before = metrics(m)

    published: list = []
    result: dict = {}

    def run():
        try:
            result["out"] = run_offline(models["a"], prompts(), logs / "guide-writer.log", kv=kv,
                                        env=guide_config(m, tmp_path), wait_keys=wait)
        except BaseException as e:  # reported by the test's thread
            result["err"] = e

    t = threading.Thread(target=run)
    t.start()
    # While the engine lives, its segment descriptor is in the master's
    # metadata server (it is removed when the engine closes).
    while t.is_alive() and not published:
        published = get_json(m.metadata + "/keys?prefix=mooncake/ram/")
        t.join(0.2)
    t.join()
    if "err" in result:
        raise result["err"]
    assert published, "vLLM's store client published no segment in the master's metadata server"
    assert all(len(o) > 0 for o in result["out"])
    assert family(metrics(m), PUTS) > family(before, PUTS), "the connector saved no block"

"""The official SGLang HiCache guides' Mooncake deployment, replayed on our
package: the master started by the installed ``mooncake_master`` console
script with the guides' flags (--enable_http_metadata_server=true, and the
complete guide's --eviction_high_watermark_ratio=0.95), the environment the
guides export (MOONCAKE_MASTER, MOONCAKE_TE_META_DATA_SERVER at the
master's own /metadata, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE, a "gb"-suffixed
MOONCAKE_GLOBAL_SEGMENT_SIZE), then SGLang's own ``--hicache-storage-backend
mooncake`` code path (no extra config: SGLang reads that environment) over
a real host KV pool, on CPU.

One change to the commands as written: the ports. The guides use the
defaults (RPC 50051, metadata 8080, metrics 9003), which other suites on a
shared machine may hold; here each is a free port given with its official
flag, and the environment names the same ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from mccluster import field, free_port, stop_process

from test_sglang_hicache import attach, fill, mha_host_pool, page_bytes, tokens, zero

SCRIPTS = Path(sys.executable).parent


@pytest.fixture
def guide_master():
    """`mooncake_master --enable_http_metadata_server=true
    --eviction_high_watermark_ratio=0.95` through the installed console
    script (the bundled command, not a MOONCAKE_BIN of the suite's)."""
    rpc, meta, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.pop("MOONCAKE_BIN", None)
    proc = subprocess.Popen(
        [str(SCRIPTS / "mooncake_master"), "--enable_http_metadata_server=true",
         "--eviction_high_watermark_ratio=0.95",
         f"--rpc_port={rpc}", f"--http_metadata_server_port={meta}", f"--metrics_port={metrics}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("master listening"):
            break
    else:
        stop_process(proc, group=True)
        pytest.fail("mooncake_master exited before listening:\n" + "".join(lines[-30:]))
    # Keep reading, so a master that logs a lot never blocks on a full pipe.
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    assert field(line, "metadata").endswith(f":{meta}/metadata"), line
    yield {"rpc": rpc, "meta": meta, "metrics": metrics, "line": line}
    stop_process(proc, group=True)


def guide_env(m: dict) -> dict:
    """What the guides export for SGLang (TCP instead of RDMA: no NICs on
    CPU hosts; the local hostname, which the guides leave to SGLang, is
    pinned to loopback as the rest of the suite does)."""
    return {"MOONCAKE_MASTER": f"127.0.0.1:{m['rpc']}",
            "MOONCAKE_TE_META_DATA_SERVER": f"http://127.0.0.1:{m['meta']}/metadata",
            "MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_DEVICE": "",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb", "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_hicache_guide_deployment(guide_master, monkeypatch):
    """SGLang's Mooncake backend, configured only by the guides'
    environment, starts against the guides' master: its segment is
    published in the master's in-process HTTP metadata server and mounted
    in the master, and pages it writes come back byte for byte."""
    for k, v in guide_env(guide_master).items():
        monkeypatch.setenv(k, v)
    meta = f"http://127.0.0.1:{guide_master['meta']}/metadata"
    assert get_json(meta + "/keys?prefix=mooncake/ram/") == []

    host = mha_host_pool()
    backend = attach(json.dumps({}), host, model_name="org/tiny")  # no extra config: the environment
    try:
        segments = get_json(meta + "/keys?prefix=mooncake/ram/")
        assert len(segments) == 1, f"SGLang's store client published its segment there: {segments}"
        seg = segments[0][len("mooncake/ram/"):]
        with urllib.request.urlopen(f"http://127.0.0.1:{guide_master['metrics']}/get_all_segments",
                                    timeout=10) as r:
            assert seg in r.read().decode().split(), "its segment is mounted in the guides' master"

        keys = [f"h{uuid.uuid4().hex}" for _ in range(3)]
        fill(host, [0, 1, 2], seed=5)
        want = [page_bytes(host, p) for p in (0, 1, 2)]
        assert backend.batch_set_v1(keys, tokens([0, 1, 2])) == [True] * 3
        assert backend.batch_exists(keys) == 3
        zero(host, [4, 5, 6])
        assert backend.batch_get_v1(keys, tokens([4, 5, 6])) == [True] * 3
        assert [page_bytes(host, p) for p in (4, 5, 6)] == want
    finally:
        backend.close()

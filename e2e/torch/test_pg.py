"""Mooncake PG (backend ``mooncake-cpu``) in real torch.distributed, 2-4 local
processes: every operation equals gloo on the same inputs (1 element to
64 MiB, uneven all_to_all), async and P2P, bad use, torchrun, and a rank
killed with kill -9 mid-loop then replaced. The ranks run pg_worker.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE, free_port


def test_ops_equal_gloo(ranks):
    """Every collective, every dtype, 1 element to 70k, 4 ranks (1000 and 70000 are not powers of two)."""
    ranks.spawn("pg_worker.py", "ops", 4, "1,1000,70000")
    ranks.check(150)
    assert all(ranks.events(f"r{r}")[-1]["n"] == 250 for r in range(4))  # 3 sizes x 5 dtypes x 16-17


def test_ops_equal_gloo_pieces(ranks):
    """Sizes past one slot (pieces), 3 ranks: the sizes no power of two."""
    ranks.spawn("pg_worker.py", "ops", 3, "1100003", "int64")
    ranks.check(150)


def test_same_host_steps_skip_the_engine(ranks):
    """Same-host peers' buffers are mapped: steps and P2P copy into them and
    store their flags directly, with no engine batch (each one costs worker
    wake-ups on a host the ranks share); results still equal gloo's."""
    ranks.spawn("pg_worker.py", "paths", 4, "mapped")
    ranks.check(120)
    assert ranks.events("r0")[-1]["batches"] == 0


def test_ops_equal_gloo_engine_path(ranks):
    """MOONCAKE_PG_MAP=0 sends every step through engine batches, the path
    peers on other hosts take: the results equal gloo's there too."""
    ranks.spawn("pg_worker.py", "paths", 3, "engine", env={"MOONCAKE_PG_MAP": "0"})
    ranks.check(120)
    assert ranks.events("r0")[-1]["batches"] > 0


@pytest.mark.parametrize("path", ["mapped", "engine"])
def test_large_64mib(ranks, path):
    """64 MiB all_reduce, all_gather, reduce_scatter, uneven all_to_all:
    copies straight from the tensors into mapped slots, and through the
    engine with the sources registered for the call."""
    ranks.spawn("pg_worker.py", "large", 4, env={"MOONCAKE_PG_MAP": "0" if path == "engine" else "1"})
    ranks.check(200)


def test_negative_control(ranks):
    """The same comparison, with SUM broken on purpose, must fail."""
    ranks.spawn("pg_worker.py", "negative", 2)
    ranks.check(60)
    ev = ranks.events("r0")[-1]
    assert ev["ev"] == "caught" and "differs from gloo" in ev["msg"], ev


def test_async_and_p2p(ranks):
    ranks.spawn("pg_worker.py", "async_p2p", 3)
    ranks.check(90)


def test_recv_from_a_rank_that_exited(ranks):
    """A message sent whole by a rank that then exited is still received."""
    ranks.spawn("pg_worker.py", "send_then_exit", 2)
    ranks.check(60)
    assert ranks.events("r0")[-1]["ev"] == "received"


def test_bad_use(ranks):
    """Mismatched shapes and dtypes, bad outputs and splits, AVG of ints,
    unsupported dtypes: clear errors on every rank, and the group still
    works; a call after destroy_process_group fails clearly."""
    ranks.spawn("pg_worker.py", "bad_use", 3)
    ranks.check(60)
    msgs = ranks.events("r1")[-1]["msgs"]
    assert "rank 1 called all_reduce(dtype=torch.float32, numel=10" in msgs["shape"], msgs


def test_torchrun(ranks, tmp_path):
    """Launched by torchrun: rank, world size and store from the environment."""
    log = open(tmp_path / "torchrun.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(HERE / "pg_worker.py"), "torchrun"],
                         stdout=log, stderr=subprocess.STDOUT, env=ranks.env(), cwd=HERE,
                         start_new_session=True)  # ranks.stop() kills torchrun's ranks with it
    ranks.procs["torchrun"] = p
    ranks.check(90)
    out = (tmp_path / "torchrun.log").read_text()
    assert out.count('"torchrun ok"') == 2 and '"backend": "mooncake-cpu"' in out, out


def test_deactivate_ranks(ranks):
    """deactivate_ranks from one rank (twice): the others follow at their
    next collective, the deactivated rank is told so."""
    ranks.spawn("pg_worker.py", "deactivate", 3)
    ranks.check(90)
    assert ranks.events("r2")[-1]["ev"] == "out"
    assert ranks.events("r1")[-1] == {"ev": "pair", "active": [1, 1, 0], "synced": 2, "rank": 1}


def test_sync_after_failure_by_hand(ranks):
    """auto_sync_on_failure=False: PeerFailure, then sync_after_failure."""
    ranks.spawn("pg_worker.py", "manual_sync", 3, env={"MOONCAKE_PG_TIMEOUT": "10"})
    ranks.check(90)
    assert ranks.events("r0")[-1]["active"] == [1, 1, 0]


def wait_for(ranks, name, text, timeout):
    deadline = time.monotonic() + timeout
    while text not in ranks.log(name):
        if time.monotonic() > deadline or ranks.procs[name].poll() is not None:
            pytest.fail(f"{name} never logged {text!r}:\n{ranks.log(name)[-3000:]}")
        time.sleep(0.05)


def test_kill9_and_rejoin(ranks):
    """Rank 3 is killed with SIGKILL mid-loop: the survivors' all_reduces
    finish over ranks 0-2 (no hang: none takes longer than the timeout) and
    rank 3 is inactive on each; a replacement started with is_extension=True
    calls join_group, rank 0 sees it in get_peer_state and recover_ranks it,
    and the four go on (all_gather checks everyone's data at the end)."""
    timeout = 10
    ranks.spawn("pg_worker.py", "ft", 4, env={"MOONCAKE_PG_TIMEOUT": str(timeout)})
    wait_for(ranks, "r3", '"at30"', 90)
    os.kill(ranks.procs["r3"].pid, signal.SIGKILL)
    ranks.procs["r3"].wait()
    ranks.start("r3b", [HERE / "pg_worker.py", "ft", 3, 4, ranks.port, "ext"],
                {"MOONCAKE_PG_TIMEOUT": str(timeout)})
    codes = ranks.wait(120, ["r0", "r1", "r2", "r3b"])
    if any(codes.values()):
        logs = "\n".join(f"--- {n}\n{ranks.log(n)[-3000:]}" for n in ("r0", "r1", "r2", "r3b"))
        pytest.fail(f"exit codes {codes}\n{logs}")
    for r in ("r0", "r1", "r2"):
        ev = ranks.events(r)
        views = [e["after"] for e in ev if e["ev"] == "view"]
        assert [1, 1, 1, 0] in views, (r, ev)  # the dead rank went inactive here
        done = ev[-1]
        assert done["ev"] == "done" and done["active"] == [1, 1, 1, 1] and done["synced"] == 4, done
        assert done["worst"] < timeout + 5, done
    joined = [e for e in ranks.events("r3b") if e["ev"] == "joined"]
    assert joined and joined[0]["active"] == [1, 1, 1, 1]
    assert any(e["ev"] == "recovered" for e in ranks.events("r0"))

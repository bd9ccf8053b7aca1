"""Mooncake EP rank activeness with a real failure: one of four worker
processes is killed with SIGKILL in the middle of a MoE step; the others
finish the step within the timeout, with that rank masked in
active_ranks, and their outputs equal the reference layer without the
dead rank's experts. Then a replacement process takes the dead rank's
place: on gloo the group is rebuilt (a new gloo group), on Mooncake PG
(mooncake-cpu) the replacement joins the same group (is_extension,
join_group, recover_ranks); survivors call update_ep_member, and a full
step matches the reference with every expert again."""

from __future__ import annotations

import os
import signal

import pytest

import ep_launch
import ep_moe
from mccluster import free_port
from test_ep import check

pytestmark = pytest.mark.skipif(ep_launch.env_ok() is not None, reason=str(ep_launch.env_ok()))

TIMEOUT_US = 3_000_000
VICTIM = 2


def have_mooncake_pg() -> bool:
    try:
        from mooncake import pg  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("at,backend", [
    # killed before sending its tokens: survivors time out in dispatch
    ("dispatch", "gloo"),
    # killed after dispatch, holding survivors' tokens: they time out in combine
    ("combine", "gloo"),
    # the same over Mooncake PG, whose own elastic protocol readmits the
    # replacement (is_extension, join_group, recover_ranks) in place
    pytest.param("combine", "mooncake-cpu",
                 marks=pytest.mark.skipif(not have_mooncake_pg(), reason="mooncake.pg is missing")),
])
def test_rank_killed_mid_step(tmp_path, at, backend):
    cfg = ep_moe.Config(world=4)
    if backend == "gloo":
        common = {"rejoin": "rebuild", "rebuild_init": f"file://{tmp_path}/store2"}
    else:
        common = {"rejoin": "pg", "backend": backend, "victim": VICTIM,
                  "init": f"tcp://127.0.0.1:{free_port()}"}
    ranks = ep_launch.start(tmp_path, cfg, steps=2, timeout_us=TIMEOUT_US, common=common,
                            extra={VICTIM: {"victim_at": at}})
    replacement = None
    try:
        victim = ranks[VICTIM]
        victim.wait_line("ready")
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        assert victim.proc.returncode == -signal.SIGKILL
        # The dead rank's replacement joins the rebuilt group.
        spec = dict(victim.spec, replacement=True, victim_at=None, out=str(tmp_path / "replacement.pt"))
        replacement = ep_launch.Rank(spec)
        survivors = [r for i, r in enumerate(ranks) if i != VICTIM]
        results = {r.spec["rank"]: r.result() for r in survivors}
        results[VICTIM] = replacement.result()
    finally:
        for r in ranks + ([replacement] if replacement else []):
            r.kill()

    step_ok, step_fault, step_rejoin = 0, 1, 2
    full = [results[r] for r in range(cfg.world)]
    survivors_only = [results[r] if r != VICTIM else None for r in range(cfg.world)]
    for r in range(cfg.world):
        if r == VICTIM:
            continue
        res = results[r]
        assert res["active"][step_ok].tolist() == [1, 1, 1, 1]
        # The fault step: the victim masked, within the timeout (plus the
        # rest of the step's work), and not before it.
        assert res["active"][step_fault].tolist() == [1, 1, 0, 1], f"rank {r}"
        assert TIMEOUT_US / 1e6 * 0.9 <= res["seconds"][step_fault] < TIMEOUT_US / 1e6 + 10, res["seconds"]
        assert res["active"][step_rejoin].tolist() == [1, 1, 1, 1]
    check(cfg, survivors_only, [step_ok])
    check(cfg, survivors_only, [step_fault], dead=(VICTIM,))
    check(cfg, full, [step_rejoin])
    # Negative control: the fault step's outputs really lack the dead
    # rank's experts (the full layer's reference does not match them).
    with pytest.raises(AssertionError):
        check(cfg, survivors_only, [step_fault])


@pytest.mark.parametrize("at", ["dispatch", "combine"])
def test_rank_hung_mid_step(tmp_path, at):
    # A rank that stops taking part but stays alive (its buffer still
    # takes writes, so only the missing completion flag can tell): the
    # others mask it when timeout_us runs out. The test kills it only
    # after the survivors have finished.
    cfg = ep_moe.Config(world=3, num_experts=6)
    victim = 1
    ranks = ep_launch.start(tmp_path, cfg, steps=2, timeout_us=TIMEOUT_US, extra={victim: {"victim_at": at}})
    try:
        ranks[victim].wait_line("ready")
        results = [r.result() if i != victim else None for i, r in enumerate(ranks)]
    finally:
        for r in ranks:
            r.kill()
    for r, res in enumerate(results):
        if res is None:
            continue
        assert res["active"][1].tolist() == [1, 0, 1], f"rank {r}"
        assert TIMEOUT_US / 1e6 * 0.9 <= res["seconds"][1] < TIMEOUT_US / 1e6 + 10, res["seconds"]
    check(cfg, results, [0])
    check(cfg, results, [1], dead=(victim,))

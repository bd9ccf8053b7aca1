"""One rank of a Mooncake EP test: ``python ep_worker.py SPEC_JSON``.

SPEC: rank, world, init (a torch.distributed init_method), backend,
out (where to torch.save the results), cfg (ep_moe.Config fields), steps
(how many MoE steps), timeout_us, and optional fault roles:
  victim_at: "dispatch" | "combine": at the last step, print "ready" and
      block before that call until the test kills this process;
  rejoin: "rebuild": after the steps, join a rebuilt gloo group at
      rebuild_init and call update_ep_member (with replacement: true,
      construct the Buffer there); "pg": with backend mooncake-cpu, the
      replacement starts with is_extension=True and join_group, survivors
      recover it (readmit) and call update_ep_member on the same group;
      then one more step with every rank active;
  bad_routing: apply expert (g+1) % E instead of g (a negative control).
Results: {"y": {step: combined}, "active": {step: active_ranks},
"seconds": {step: wall time}, "errors": [...]} and "done" on stdout.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_moe  # noqa: E402
from mooncake.mooncake_ep_buffer import Buffer, per_token_cast_back  # noqa: E402


def moe_step(buf, cfg, spec, step, active, weights, block_at=None):
    gate, w1, w2 = weights
    rank = buf.rank
    x = ep_moe.tokens(cfg, rank, step)
    idx, w = ep_moe.route(cfg, x, gate, rank)
    if block_at == "dispatch":
        block()
    t0 = time.monotonic()
    recv_x, recv_count, handle, _, _ = buf.dispatch(x, idx, active, cfg.max_tokens, cfg.num_experts,
                                                   spec["timeout_us"], use_fp8=cfg.fp8)
    if cfg.fp8:
        rows = per_token_cast_back(*recv_x)
    else:
        rows = recv_x.to(torch.float32)
    zero_copy = spec.get("zero_copy", False)
    out = buf.get_next_combine_buffer(handle) if zero_copy else \
        torch.empty(cfg.local_experts, cfg.world * cfg.max_tokens, cfg.hidden, dtype=ep_moe.out_dtype(cfg))
    for e, c in enumerate(recv_count.tolist()):
        g = rank * cfg.local_experts + e
        if spec.get("bad_routing"):
            g = (g + 1) % cfg.num_experts
        if c:
            out[e, :c] = ep_moe.expert(w1, w2, g, rows[e, :c]).to(out.dtype)
    if block_at == "combine":
        block()
    y, _, _ = buf.combine(out, idx, w, active, spec["timeout_us"], handle, zero_copy=zero_copy)
    return y, time.monotonic() - t0


def init_group(spec, rank, world, extension=False):
    kw = {}
    if spec.get("backend") == "mooncake-cpu":
        from mooncake import pg

        kw["pg_options"] = pg.MooncakeBackendOptions(world, extension)
    dist.init_process_group(spec.get("backend", "gloo"), init_method=spec["init"], rank=rank, world_size=world, **kw)


def readmit(victim, world):
    """Mooncake PG's elastic protocol on a survivor: rank 0 recovers the
    victim's replacement once it is ready; every survivor repeats a
    one-element all_reduce until the sum shows the replacement took part
    (its first collective after join_group), so all leave on the same one."""
    from mooncake import pg

    grp = dist.group.WORLD
    while True:
        if dist.get_rank() == 0 and not pg.get_active_ranks(grp)[victim] and pg.get_peer_state(grp, [victim])[0]:
            pg.recover_ranks(grp, [victim])
        x = torch.ones(1)
        try:
            dist.all_reduce(x)
        except pg.PeerFailure:
            continue  # the collective the victim's death was found in
        if int(x.item()) == world:
            return
        time.sleep(0.01)  # the replacement is a process still starting


def block():
    """Tells the test this rank is mid-step, then waits to be killed."""
    print("ready", flush=True)
    sys.stdin.read()
    os._exit(3)  # the test closed stdin instead of killing: a test bug


def main():
    spec = json.loads(sys.argv[1])
    # A hung rank shows where it hangs (the test gives up at 180 s).
    faulthandler.dump_traceback_later(150, exit=True)
    # Several ranks share a few cores: intra-op threads would only fight.
    torch.set_num_threads(1)
    cfg = ep_moe.Config(**spec["cfg"])
    rank, world = spec["rank"], spec["world"]
    res = {"y": {}, "active": {}, "seconds": {}, "errors": []}
    weights = ep_moe.weights(cfg)
    nbytes = Buffer.get_ep_buffer_size_hint(cfg.max_tokens, cfg.hidden, world, cfg.num_experts)
    pg_rejoin = spec.get("rejoin") == "pg"
    if not spec.get("replacement"):
        init_group(spec, rank, world)
        buf = Buffer(dist.group.WORLD, nbytes)
        active = torch.ones(world, dtype=torch.int32)
        for step in range(spec["steps"]):
            last = step == spec["steps"] - 1
            y, secs = moe_step(buf, cfg, spec, step, active, weights,
                               block_at=spec.get("victim_at") if last else None)
            res["y"][step], res["active"][step], res["seconds"][step] = y, active.clone(), secs
        if pg_rejoin:
            readmit(spec["victim"], world)
            buf.update_ep_member()
        elif spec.get("rejoin") == "rebuild":
            # The old group has a dead member: leave it without a collective.
            dist.destroy_process_group()
            dist.init_process_group("gloo", init_method=spec["rebuild_init"], rank=rank, world_size=world)
            buf.update_ep_member(dist.group.WORLD)
    elif pg_rejoin:
        from mooncake import pg

        init_group(spec, rank, world, extension=True)
        pg.join_group(dist.group.WORLD)
        x = torch.ones(1)
        dist.all_reduce(x)  # the survivors' readmit loop ends on this one
        buf = Buffer(dist.group.WORLD, nbytes)
    else:
        dist.init_process_group("gloo", init_method=spec["rebuild_init"], rank=rank, world_size=world)
        buf = Buffer(dist.group.WORLD, nbytes)
    if spec.get("rejoin"):
        step = spec["steps"]
        active = torch.ones(world, dtype=torch.int32)
        y, secs = moe_step(buf, cfg, spec, step, active, weights)
        res["y"][step], res["active"][step], res["seconds"][step] = y, active.clone(), secs
    torch.save(res, spec["out"])
    print("done", flush=True)
    buf.destroy()
    # Skip destroy_process_group: with a dead peer it may wait on it.
    os._exit(0)


if __name__ == "__main__":
    main()

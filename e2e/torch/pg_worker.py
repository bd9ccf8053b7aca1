"""One rank of a test_pg.py case: ``python pg_worker.py CASE RANK WORLD PORT
[ARGS]`` (or, under torchrun, ``pg_worker.py CASE``, with the rank and world
from the environment). It initialises the ``mooncake-cpu`` group (and a gloo
group over the same ranks for the reference results), runs the case and
exits 0; an assertion that fails exits non-zero with the reason."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from mooncake import pg

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
R = dist.ReduceOp


def log(**kw) -> None:
    kw["rank"] = dist.get_rank() if dist.is_initialized() else -1
    print(json.dumps(kw), flush=True)


def data(n: int, dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Small integer values: every sum, product and mean below is exact in
    every dtype, so results must equal gloo's bit for bit."""
    return ((torch.arange(n) * 3 + salt) % 5 + rank).to(dtype)


def same(what: str, ours: torch.Tensor, ref: torch.Tensor) -> None:
    if ours.dtype != ref.dtype or ours.shape != ref.shape or not torch.equal(ours, ref):
        bad = (ours != ref).nonzero()[:3].flatten().tolist() if ours.shape == ref.shape else "shape"
        raise AssertionError(f"{what}: mooncake-cpu differs from gloo (first bad index {bad}: "
                             f"{ours.flatten()[:6].tolist()} vs {ref.flatten()[:6].tolist()})")


def compare_ops(gloo, sizes, dtypes=DTYPES) -> int:
    """Runs every operation on the mooncake-cpu group and on gloo with the
    same inputs and asserts equal outputs; returns how many it compared."""
    rank, W = dist.get_rank(), dist.get_world_size()
    checked = 0
    for n in sizes:
        for dt in dtypes:
            tag = f"n={n} {dt}"
            ops = [R.SUM, R.MIN, R.MAX]
            if n <= 4096:
                ops.append(R.PRODUCT)
            for op in ops:
                x = data(n, dt, rank, 1) if op != R.PRODUCT else (data(n, dt, rank) % 2 + 1)
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op)
                dist.all_reduce(b, op=op, group=gloo)
                same(f"all_reduce {op} {tag}", a, b)
                checked += 1
            if dt.is_floating_point:
                a = data(n, dt, rank)
                b = a.clone()
                dist.all_reduce(a, op=R.AVG)
                dist.all_reduce(b, group=gloo)
                same(f"all_reduce AVG {tag}", a, b / W)
            x = data(n, dt, rank, 2)
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=1 % W)
            dist.broadcast(b, src=1 % W, group=gloo)
            same(f"broadcast {tag}", a, b)
            outs_a = [torch.zeros(n, dtype=dt) for _ in range(W)]
            outs_b = [torch.zeros(n, dtype=dt) for _ in range(W)]
            dist.all_gather(outs_a, x)
            dist.all_gather(outs_b, x, group=gloo)
            same(f"all_gather {tag}", torch.stack(outs_a), torch.stack(outs_b))
            fa, fb = torch.zeros(W * n, dtype=dt), torch.zeros(W * n, dtype=dt)
            dist.all_gather_into_tensor(fa, x)
            dist.all_gather_into_tensor(fb, x, group=gloo)
            same(f"all_gather_into_tensor {tag}", fa, fb)
            big = data(W * n, dt, rank, 3)
            ra, rb = torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt)
            dist.reduce_scatter_tensor(ra, big)
            dist.reduce_scatter_tensor(rb, big, group=gloo)
            same(f"reduce_scatter_tensor {tag}", ra, rb)
            a, b = x.clone(), x.clone()
            dist.reduce(a, dst=W - 1, op=R.MAX)
            dist.reduce(b, dst=W - 1, op=R.MAX, group=gloo)
            if rank == W - 1:
                same(f"reduce {tag}", a, b)
            ga = [torch.zeros(n, dtype=dt) for _ in range(W)] if rank == 0 else None
            gb = [torch.zeros(n, dtype=dt) for _ in range(W)] if rank == 0 else None
            dist.gather(x, ga, dst=0)
            dist.gather(x, gb, dst=0, group=gloo)
            if rank == 0:
                same(f"gather {tag}", torch.stack(ga), torch.stack(gb))
            sc = [data(n, dt, i, 4) for i in range(W)] if rank == W - 1 else None
            sa, sb = torch.zeros(n, dtype=dt), torch.zeros(n, dtype=dt)
            dist.scatter(sa, sc, src=W - 1)
            dist.scatter(sb, sc, src=W - 1, group=gloo)
            same(f"scatter {tag}", sa, sb)
            # all_to_all: even, then uneven splits (rank r sends r+p+1
            # rows of 3 to rank p, some of them empty when n is tiny).
            ea, eb = torch.zeros(W * n, dtype=dt), torch.zeros(W * n, dtype=dt)
            src = data(W * n, dt, rank, 5)
            dist.all_to_all_single(ea, src)
            dist.all_to_all_single(eb, src, group=gloo)
            same(f"all_to_all_single {tag}", ea, eb)
            k = max(1, n // 64)
            ins = [((rank + p) % 3) * k for p in range(W)]
            outs = [((p + rank) % 3) * k for p in range(W)]
            src = data(sum(ins) * 3, dt, rank, 6).view(-1, 3)
            ua, ub = torch.zeros(sum(outs), 3, dtype=dt), torch.zeros(sum(outs), 3, dtype=dt)
            dist.all_to_all_single(ua, src, outs, ins)
            dist.all_to_all_single(ub, src, outs, ins, group=gloo)
            same(f"all_to_all_single uneven {tag}", ua, ub)
            # The list form: gloo takes equal sizes only, so the uneven
            # list is checked against gloo's uneven all_to_all_single.
            la = [torch.zeros(outs[p] * 3, dtype=dt) for p in range(W)]
            li = list(src.reshape(-1).split([i * 3 for i in ins]))
            dist.all_to_all(la, li)
            same(f"all_to_all uneven {tag}", torch.cat(la), ub.reshape(-1))
            la = [torch.zeros(n, dtype=dt) for p in range(W)]
            lb = [torch.zeros(n, dtype=dt) for p in range(W)]
            li = [data(n, dt, rank, 8 + p) for p in range(W)]
            dist.all_to_all(la, li)
            dist.all_to_all(lb, li, group=gloo)
            same(f"all_to_all {tag}", torch.cat(la), torch.cat(lb))
            checked += 13
    return checked


def case_ops(args) -> None:
    gloo = dist.new_group(backend="gloo")
    sizes = [int(s) for s in args[0].split(",")]
    dtypes = DTYPES if len(args) < 2 else [getattr(torch, d) for d in args[1].split(",")]
    t = time.monotonic()
    n = compare_ops(gloo, sizes, dtypes)
    log(ev="compared", n=n, s=time.monotonic() - t)


def case_paths(args) -> None:
    """Which path steps take: "mapped" (same-host peers' buffers mapped,
    the default) makes no engine batch in any collective or P2P message;
    "engine" (run with MOONCAKE_PG_MAP=0: the path remote peers take) does.
    Either way every operation equals gloo."""
    gloo = dist.new_group(backend="gloo")
    eng = pg._get_engine()
    calls = []
    real = eng.transfer

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    eng.transfer = counted
    n = compare_ops(gloo, [1, 70000, 300000], [torch.float32, torch.int64])
    rank, W = dist.get_rank(), dist.get_world_size()
    t = torch.arange(100000, dtype=torch.float32) + rank
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        r = torch.empty_like(t)
        dist.recv(r, 0)
        same("send/recv", r, t - 1)
    dist.barrier()
    eng.transfer = real
    if args[0] == "mapped":
        assert not calls, f"{len(calls)} engine batches with every peer on this host"
        # Doorbells: a waiting rank is rung by whoever completes its flags,
        # not by every peer (W - 1 rings per rank and step).
        comm = pg._pg(dist.group.WORLD)._comm
        rings = []
        ring = comm.ring
        comm.ring = lambda p, bell: (rings.append(bell), ring(p, bell))
        steps = 60
        x = torch.ones(1000)
        for _ in range(steps):
            dist.all_reduce(x)
        comm.ring = ring
        total = torch.tensor([len(rings)], dtype=torch.int64)
        dist.all_reduce(total, group=gloo)
        every = W * (W - 1) * steps
        assert total.item() <= every * 3 // 4, f"{total.item()} doorbells in {steps} steps ({every} when all ring)"
        log(ev="rings", total=total.item(), every=every)
        # Steps per all_reduce: up to 4 MiB one (reduced in place from the
        # mapped slots); 16 MiB one reduce-scatter + all-gather piece (a
        # slot's payload is a whole 4 MiB per rank).
        for n, want in ((1 << 18, 1), (1 << 20, 1), (1 << 22, 2)):
            y = torch.ones(n)
            s0 = comm.step
            dist.all_reduce(y)
            assert comm.step - s0 == want, f"all_reduce of {4 * n} bytes took {comm.step - s0} steps, want {want}"
            assert y[0].item() == W and y[-1].item() == W, y
    else:
        assert calls, "no engine batch with MOONCAKE_PG_MAP=0"
    log(ev="paths", path=args[0], batches=len(calls), n=n)


def case_large(args) -> None:
    """64 MiB all_reduce, all_gather, reduce_scatter and all_to_all (float32)."""
    gloo = dist.new_group(backend="gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    n = 16 << 20
    x = data(n, torch.float32, rank)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    same("all_reduce 64 MiB", a, b)
    del a, b
    oa, ob = torch.empty(W * n), torch.empty(W * n)
    dist.all_gather_into_tensor(oa, x)
    dist.all_gather_into_tensor(ob, x, group=gloo)
    same("all_gather 64 MiB", oa, ob)
    ra, rb = torch.empty(n // W), torch.empty(n // W)
    dist.reduce_scatter_tensor(ra, x)
    dist.reduce_scatter_tensor(rb, x, group=gloo)
    same("reduce_scatter_tensor 64 MiB", ra, rb)
    del oa, ob
    ins = [(n // W) + (p - rank) * 4096 for p in range(W)]
    ins[-1] = n - sum(ins[:-1])
    allins = [[(n // W) + (p - q) * 4096 for p in range(W)] for q in range(W)]
    for q in range(W):
        allins[q][-1] = n - sum(allins[q][:-1])
    outs = [allins[q][rank] for q in range(W)]
    ua, ub = torch.empty(sum(outs)), torch.empty(sum(outs))
    dist.all_to_all_single(ua, x, outs, ins)
    dist.all_to_all_single(ub, x, outs, ins, group=gloo)
    same("all_to_all_single uneven 64 MiB", ua, ub)
    log(ev="large ok")


def case_negative(args) -> None:
    """The comparison catches a wrong reduction: SUM made to subtract."""
    gloo = dist.new_group(backend="gloo")
    real = pg._combine

    def wrong(acc, x, code):
        if code == 1:
            acc.sub_(x)
        else:
            real(acc, x, code)
    pg._combine = wrong
    try:
        compare_ops(gloo, [5], [torch.int32])
    except AssertionError as e:
        log(ev="caught", msg=str(e))
        return
    raise AssertionError("a SUM that subtracts went unnoticed")


def case_async_p2p(args) -> None:
    """async_op collectives in flight together; isend/irecv in a ring (sizes
    across the P2P slot), batch_isend_irecv both ways at once."""
    gloo = dist.new_group(backend="gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    xs = [data(1000 * (i + 1), torch.float32, rank, i) for i in range(4)]
    ours = [x.clone() for x in xs]
    works = [dist.all_reduce(t, async_op=True) for t in ours]
    ag = [torch.zeros(77, dtype=torch.int64) for _ in range(W)]
    works.append(dist.all_gather(ag, data(77, torch.int64, rank), async_op=True))
    for w in works:
        w.wait()
    for x, t in zip(xs, ours):
        ref = x.clone()
        dist.all_reduce(ref, group=gloo)
        same("async all_reduce", t, ref)
    ref = [torch.zeros(77, dtype=torch.int64) for _ in range(W)]
    dist.all_gather(ref, data(77, torch.int64, rank), group=gloo)
    same("async all_gather", torch.stack(ag), torch.stack(ref))
    for n in (1, 1000, 300_000):
        nxt, prv = (rank + 1) % W, (rank - 1) % W
        out = data(n, torch.float32, rank, 7)
        got = torch.zeros(n)
        s = dist.isend(out, nxt)
        r = dist.irecv(got, prv)
        s.wait()
        r.wait()
        same(f"isend/irecv n={n}", got, data(n, torch.float32, prv, 7))
        gots = {p: torch.zeros(n, dtype=torch.int32) for p in range(W) if p != rank}
        opsl = []
        for p in range(W):
            if p != rank:
                opsl.append(dist.P2POp(dist.isend, data(n, torch.int32, rank, p), p))
                opsl.append(dist.P2POp(dist.irecv, gots[p], p))
        for w in dist.batch_isend_irecv(opsl):
            w.wait()
        for p, g in gots.items():
            same(f"batch_isend_irecv n={n} from {p}", g, data(n, torch.int32, p, rank))
    dist.barrier()
    log(ev="async p2p ok")


def expect_error(what: str, fn, words) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - checking the message
        msg = f"{type(e).__name__}: {e}"
        if not all(w in msg for w in words):
            raise AssertionError(f"{what}: unclear error {msg!r} (wanted {words})")
        return msg
    raise AssertionError(f"{what}: no error")


def case_bad_use(args) -> None:
    rank, W = dist.get_rank(), dist.get_world_size()
    msgs = {}
    msgs["shape"] = expect_error("mismatched shapes", lambda: dist.all_reduce(torch.ones(10 if rank else 20)),
                                 ["mismatch", "numel=20", "numel=10"])
    msgs["dtype"] = expect_error("mismatched dtypes",
                                 lambda: dist.all_gather_into_tensor(
                                     torch.zeros(4 * W, dtype=torch.int32 if rank == 1 else torch.float32),
                                     torch.zeros(4, dtype=torch.int32 if rank == 1 else torch.float32)),
                                 ["mismatch", "dtype="])
    msgs["out size"] = expect_error("all_gather output too small",
                                    lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.zeros(4)),
                                    ["all_gather_into_tensor", "must hold"])
    msgs["avg int"] = expect_error("AVG of ints", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                                                           op=R.AVG), ["AVG", "floating"])
    msgs["dtype kind"] = expect_error("unsupported dtype",
                                      lambda: dist.broadcast(torch.ones(3, dtype=torch.uint32), 0),
                                      ["unsupported dtype"])
    ins = [1] * W
    outs = [1] * W
    if rank == 0:
        ins[1] = 2  # rank 0 sends two rows to rank 1, which expects one
    msgs["splits"] = expect_error("all_to_all splits", lambda: dist.all_to_all_single(
        torch.zeros(sum(outs)), torch.zeros(sum(ins)), outs, ins), ["splits mismatch"])
    # After all that, the group still works.
    x = torch.full((5,), float(rank))
    dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(W)))] * 5, x
    dist.destroy_process_group()
    msgs["destroyed"] = expect_error("all_reduce after destroy", lambda: dist.all_reduce(torch.ones(2)),
                                     ["not been initialized"])
    log(ev="bad use ok", msgs=msgs)


def pair_p2p(rank: int, W: int, tag: int) -> None:
    """Rank 0 and rank W-1 swap a tensor with send/recv (the others skip)."""
    if rank not in (0, W - 1):
        return
    peer = W - 1 - rank
    got = torch.zeros(3)
    if rank == 0:
        dist.send(torch.full((3,), float(tag * 10 + rank)), peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(torch.full((3,), float(tag * 10 + rank)), peer)
    assert got.tolist() == [float(tag * 10 + peer)] * 3, (tag, got)


def case_ft(args) -> None:
    """Loops all_reduce (+ all_gather); rank W-1 is killed by the test at
    iteration 30; rank 0 recovers its replacement, which joins; each rank
    stops 30 iterations after the full group is back."""
    rank, W = dist.get_rank(), dist.get_world_size()
    grp = dist.group.WORLD
    ext = len(args) > 0 and args[0] == "ext"
    if ext:
        log(ev="joining")
        pg.join_group(grp)
        log(ev="joined", active=pg.get_active_ranks(grp).tolist())
    else:
        pair_p2p(rank, W, 1)  # P2P traffic with the rank to be replaced
    it = after = 0
    worst = 0.0
    saw = False
    # A time bound, not a count: a fast loop runs thousands of iterations
    # while the replacement is still importing torch.
    deadline = time.monotonic() + 100
    while True:
        before = pg.get_active_ranks(grp).tolist()
        x = torch.full((1000,), float(rank + 1))
        t = time.monotonic()
        err = None
        try:
            dist.all_reduce(x)
        except pg.PeerFailure as e:  # only the collective a rank died in may say so
            err = str(e)
        dt = time.monotonic() - t
        worst = max(worst, dt)
        act = pg.get_active_ranks(grp).tolist()
        want = {sum(i + 1 for i in range(W) if v[i]) for v in (before, act)}
        if err is None and x[0].item() not in want:
            raise AssertionError(f"all_reduce gave {x[0].item()}, want one of {want} (active {before} -> {act})")
        if before != act or err:
            log(ev="view", it=it, before=before, after=act, err=err, dt=dt, val=x[0].item())
        saw = saw or not all(act)
        it += 1
        if it == 30 and not ext:
            log(ev="at30")
        if rank == 0 and not act[W - 1] and pg.get_peer_state(grp, [W - 1])[0]:
            pg.recover_ranks(grp, [W - 1])
            log(ev="recovered", active=pg.get_active_ranks(grp).tolist())
        if all(act) and (ext or saw):
            after += 1
            if after == 30:
                break
        if time.monotonic() > deadline:
            raise AssertionError(f"the group never came back to full size ({it} iterations)")
    g = [torch.zeros(2) for _ in range(W)]
    dist.all_gather(g, torch.full((2,), float(rank)))
    assert [t[0].item() for t in g] == [float(i) for i in range(W)], g
    # The replacement talks to rank 0 point to point, as its dead
    # predecessor did: the pair's chunk counters start over with it.
    pair_p2p(rank, W, 2)
    log(ev="done", it=it, worst=worst, active=pg.get_active_ranks(grp).tolist(),
        synced=pg.get_num_synced_ranks(grp))


def case_deactivate(args) -> None:
    """Rank 0 deactivates rank 2 (once, then again: repeats are safe); ranks
    0 and 1 go on as a pair, rank 2's next collective says it is out."""
    rank = dist.get_rank()
    grp = dist.group.WORLD
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [6.0] * 4, x
    dist.barrier()
    if rank == 0:
        pg.deactivate_ranks(grp, [2])
        pg.deactivate_ranks(grp, [2])
    x = torch.full((4,), float(rank + 1))
    if rank == 2:
        msg = expect_error("collective of a deactivated rank", lambda: dist.all_reduce(x), ["deactivated"])
        msg2 = expect_error("and after", lambda: dist.barrier(), ["not active"])
        log(ev="out", msg=msg, msg2=msg2)
        return
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 4, x
    act = pg.get_active_ranks(grp).tolist()
    assert act == [1, 1, 0], act
    assert pg.get_peer_state(grp, [0, 1, 2]) == [True, True, False]
    log(ev="pair", active=act, synced=pg.get_num_synced_ranks(grp))


def case_manual_sync(args) -> None:
    """auto_sync_on_failure=False: rank 2 exits abruptly; the survivors'
    collective raises PeerFailure naming it, and after sync_after_failure
    on both they go on as a pair."""
    rank = dist.get_rank()
    grp = dist.group.WORLD
    dist.barrier()
    if rank == 2:
        os._exit(0)
    x = torch.ones(4)
    # "(call sync_after_failure)" on the rank that saw it first; "during
    # this collective" on one that got the other's sync request meanwhile.
    msg = expect_error("collective with a dead peer", lambda: dist.all_reduce(x), ["ranks [2] failed"])
    assert pg.get_active_ranks(grp).tolist() == [1, 1, 1]  # nothing applied before the sync
    pg.sync_after_failure(grp)
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 4, x
    log(ev="synced", msg=msg, active=pg.get_active_ranks(grp).tolist())


def case_send_then_exit(args) -> None:
    """Rank 1 sends one message and leaves at once; rank 0 posts its recv
    only after rank 1 is gone: the message arrived whole, so the recv
    must complete (its acknowledgement has no one left to free)."""
    rank = dist.get_rank()
    grp = dist.group.WORLD
    dist.barrier()
    if rank == 1:
        dist.send(torch.arange(5, dtype=torch.float32), 0)
        return  # main destroys the group (its memory with it) and exits
    deadline = time.monotonic() + 30
    while pg.get_peer_state(grp, [1])[0]:
        assert time.monotonic() < deadline, "rank 1 never exited"
        time.sleep(0.01)
    got = torch.zeros(5)
    dist.recv(got, 1)
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], got
    log(ev="received", got=got.tolist())


def case_torchrun(args) -> None:
    rank, W = dist.get_rank(), dist.get_world_size()
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [float(W * (W + 1) // 2)] * 3, x
    log(ev="torchrun ok", world=W, backend=dist.get_backend())


def main() -> None:
    case = sys.argv[1]
    if "RANK" in os.environ and len(sys.argv) == 2:  # torchrun
        dist.init_process_group("mooncake-cpu")
        args = []
    else:
        rank, world, port = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        args = sys.argv[5:]
        opts = pg.MooncakeBackendOptions(world, bool(args and args[0] == "ext"))
        if case == "manual_sync":
            opts = pg.MooncakeBackendOptions(world, False, True, False)
        store = dist.TCPStore("127.0.0.1", int(port), world, is_master=False)
        dist.init_process_group("mooncake-cpu", store=store, rank=rank, world_size=world, pg_options=opts)
    globals()[f"case_{case}"](args)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

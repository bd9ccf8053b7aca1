"""join_group's search for the view that takes this rank, on a real torch
store, without processes: the views of epochs 1 and 2 are decided (the
second has the joiner), and the joiner starts from epoch 0."""

from __future__ import annotations

import json
import threading
import types

import torch.distributed as dist

from mooncake import _pg_comm


def view(ranks, coll):
    return json.dumps({"view": ranks, "dead": [], "base": 8, "pos": (coll + 1) << 32})


def joiner(store):
    applied = []
    me = types.SimpleNamespace(lock=threading.Lock(), joined=False, store=store, rank=2, inc="1",
                               epoch=0, coll=0, _apply=lambda d: applied.append(d.epoch))
    t = threading.Thread(target=_pg_comm.Comm.join, args=(me,), daemon=True)
    t.start()
    t.join(10)
    return t.is_alive(), applied, me


def test_join_follows_every_decided_view():
    st = dist.HashStore()
    st.set("ft/1/view", view([0, 1], 3))
    st.set("ft/2/view", view([0, 1, 2], 7))
    # A counter of the latest epoch that a slow rank set back to 1 (the
    # joiner used to stop at it and wait for ever) means nothing now.
    st.set("ft/cur", "1")
    hung, applied, me = joiner(st)
    assert not hung, "join_group did not find the view of epoch 2"
    assert applied == [2] and me.epoch == 2 and me.coll == 7
    assert not st.check(["join/2"])


def test_join_waits_for_a_view_with_it():
    st = dist.HashStore()
    st.set("ft/1/view", view([0, 1], 3))
    done = threading.Event()

    def decide_later():
        done.wait(0.2)
        st.set("ft/2/view", view([0, 1, 2], 5))

    threading.Thread(target=decide_later, daemon=True).start()
    hung, applied, me = joiner(st)
    assert not hung and applied == [2] and me.coll == 5

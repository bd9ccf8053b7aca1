"""Striped replicas from Python: mooncake_go.Replicate(stripe_count=) and
the compat ReplicateConfig.stripe_count cut a replica into pieces on
distinct segments (this store's and the cluster's node), which read back
whole; the replica's descriptor is its first piece."""

from __future__ import annotations

import os
import uuid

import pytest

import mooncake_go as mg
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

from conftest import LOCAL_BUFFER


def test_native_stripes(master):
    value = os.urandom((1 << 20) + 5)
    key, whole = "stripes-" + uuid.uuid4().hex, "whole-" + uuid.uuid4().hex
    with mg.Store(master, segment_size=16 << 20, local_buffer_size=16 << 20, local_hostname="127.0.0.1") as s:
        s.put(key, value, mg.Replicate(stripe_count=2))
        s.put(whole, value, mg.Replicate(stripe_count=1))
        assert s.get(key) == value
        reps = s.replicas(key)
        assert len(reps) == 1 and 0 < reps[0]["size"] < len(value), reps
        assert s.replicas(whole)[0]["size"] == len(value)
        with pytest.raises(ValueError):
            s.put(key, value, mg.Replicate(stripe_count=-1))
        s.remove(key, force=True)
        s.remove(whole, force=True)


def test_compat_stripe_count(master):
    value = os.urandom(600 << 10)
    key = "compat-stripes-" + uuid.uuid4().hex
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, LOCAL_BUFFER, "tcp", "", master) == 0
    try:
        rc = ReplicateConfig()
        assert rc.stripe_count == 0
        rc.stripe_count = 2
        assert s.put(key, value, rc) == 0
        assert s.get(key) == value
        desc = s.get_replica_desc(key)
        assert len(desc) == 1
        assert 0 < desc[0].get_memory_descriptor().buffer_descriptor.size < len(value)
        assert s.remove(key, force=True) == 0
    finally:
        s.close()

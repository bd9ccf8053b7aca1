"""Tenants (docs/tenants.md): a store names its tenant (compat setup's
tenant_id, mooncake_go.Store(tenant_id=...), MOONCAKE_TENANT_ID); two
tenants using the same keys never see each other's objects, and a store
that names none is the "default" tenant's, as every client was before."""

from __future__ import annotations

import uuid

import pytest

import mooncake_go as mg
from mooncake.store import MooncakeDistributedStore
from mooncake_go import errors

from conftest import LOCAL_BUFFER


def compat(master, **kwargs) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    # No segment of its own: the cluster's node holds the values.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", master, **kwargs) == 0
    return s


def test_compat_tenants_never_see_each_other(master):
    key, only_a = "tenant-" + uuid.uuid4().hex, "only-a-" + uuid.uuid4().hex
    d = compat(master)  # no tenant_id: "default"
    a = compat(master, tenant_id="team-a")
    b = MooncakeDistributedStore()
    assert b.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "0",
                    "local_buffer_size": "32MB", "protocol": "tcp", "master_server_addr": master,
                    "tenant_id": "team-b"}) == 0
    try:
        stores = {"default": d, "team-a": a, "team-b": b}
        for who, s in stores.items():
            assert s.put(key, who.encode() * 10) == 0
        assert a.put(only_a, b"a") == 0
        for who, s in stores.items():
            assert s.get(key) == who.encode() * 10, who
            assert s.is_exist(only_a) == (1 if who == "team-a" else 0), who
        assert b.get(only_a) == b""
        # Removals stay within the tenant.
        assert b.remove_all(force=True) == 1
        assert a.is_exist(key) == 1 and d.is_exist(key) == 1 and b.is_exist(key) == 0
        assert d.remove(key, force=True) == 0
        assert a.get(key) == b"team-a" * 10
        assert a.remove_by_regex("^(tenant|only-a)-", force=True) == 2
    finally:
        for s in (d, a, b):
            assert s.close() == 0


def test_compat_refuses_a_bad_tenant(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", master, tenant_id="no spaces") == -600


def test_native_tenant_from_argument_and_environment(master, monkeypatch):
    key = "native-tenant-" + uuid.uuid4().hex
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "from-env")
    opts = dict(segment_size=-1, local_buffer_size=LOCAL_BUFFER, local_hostname="127.0.0.1")
    with mg.Store(master, **opts) as env, mg.Store(master, tenant_id="explicit", **opts) as explicit:
        env.put(key, b"env")
        explicit.put(key, b"explicit")
        assert env.get(key) == b"env"
        assert explicit.get(key) == b"explicit"
        monkeypatch.delenv("MOONCAKE_TENANT_ID")
        with mg.Store(master, **opts) as default:
            assert not default.exists(key)
            with pytest.raises(errors.ObjectNotFound):
                default.get(key)
        env.remove(key, force=True)
        explicit.remove(key, force=True)


def test_quota_code_maps_to_its_exception():
    e = errors.from_status(-1700, errors.DOMAIN_STORE, "TENANT_QUOTA_EXCEEDED", 'tenant "t": over its quota')
    assert isinstance(e, errors.TenantQuotaExceeded)
    assert isinstance(e, errors.StoreError)

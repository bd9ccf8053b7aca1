"""SSD offload configured as the frameworks do (docs/tiers-restarts.md):
official setup()'s enable_ssd_offload/ssd_offload_path (SGLang passes them
from MOONCAKE_ENABLE_SSD_OFFLOAD and MOONCAKE_OFFLOAD_FILE_STORAGE_PATH),
and the environment alone for a store made through the library."""

from __future__ import annotations

import os
import uuid

import mooncake_go as mg
from mooncake.store import MooncakeDistributedStore

from conftest import LOCAL_BUFFER

TIER = 16 << 20


def tier_file(d) -> str:
    return os.path.join(str(d), "mooncake-ssd-0.seg")


def test_compat_setup_gives_an_ssd_tier(master, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", str(TIER))
    monkeypatch.delenv("MOONCAKE_ENABLE_SSD_OFFLOAD", raising=False)
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    d = tmp_path / "ssd"
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, LOCAL_BUFFER, "tcp", "", master,
                   enable_ssd_offload=True, ssd_offload_path=str(d)) == 0
    try:
        assert os.path.getsize(tier_file(d)) == TIER, "the tier file is made, at the size asked"
        # The arguments were lent to the library for the store's creation only.
        assert "MOONCAKE_ENABLE_SSD_OFFLOAD" not in os.environ
        assert "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH" not in os.environ
        key = "ssd-" + uuid.uuid4().hex
        assert s.put(key, b"x" * 4096) == 0
        assert s.get(key) == b"x" * 4096
    finally:
        assert s.close() == 0


def test_compat_setup_dict_and_positional(master, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", str(TIER))
    a, b = tmp_path / "a", tmp_path / "b"
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16MB",
                    "local_buffer_size": "32MB", "protocol": "tcp", "master_server_addr": master,
                    "enable_ssd_offload": True, "ssd_offload_path": str(a)}) == 0
    t = MooncakeDistributedStore()
    assert t.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, LOCAL_BUFFER, "tcp", "", master, None, True, str(b)) == 0
    try:
        assert os.path.getsize(tier_file(a)) == TIER
        assert os.path.getsize(tier_file(b)) == TIER
    finally:
        assert s.close() == 0 and t.close() == 0


def test_compat_offload_path_from_environment(master, tmp_path, monkeypatch):
    # Official setup(): ssd_offload_path overrides the variable, which is
    # used when the argument is empty.
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", str(TIER))
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", str(tmp_path))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, LOCAL_BUFFER, "tcp", "", master, enable_ssd_offload=True) == 0
    try:
        assert os.path.getsize(tier_file(tmp_path)) == TIER
        assert os.environ["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] == str(tmp_path)
    finally:
        assert s.close() == 0


def test_compat_offload_without_a_path_is_refused(master, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", master, enable_ssd_offload=True) == -600


def test_native_store_tier_from_environment(master, tmp_path, monkeypatch):
    # Set after the library loaded: it reads the live environment.
    monkeypatch.setenv("MOONCAKE_ENABLE_SSD_OFFLOAD", "true")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", str(tmp_path))
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", str(TIER))
    with mg.Store(master, segment_size=16 << 20, local_buffer_size=LOCAL_BUFFER, local_hostname="127.0.0.1"):
        assert os.path.getsize(tier_file(tmp_path)) == TIER

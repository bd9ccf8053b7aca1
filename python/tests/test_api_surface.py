"""The installed package: the bundled library, and the compat modules'
method names and keyword arguments, as the official bindings name them
(callers pass many of them by keyword)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import mooncake
import mooncake_go
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

# method -> leading parameter names (after self) of the official bindings;
# None where the official binding's parameters are positional-only.
ENGINE = {
    "initialize": None,
    "initialize_ext": None,
    "get_rpc_port": [],
    "register_memory": ["buffer_addr", "capacity", "location"],
    "unregister_memory": None,
    "batch_register_memory": ["buffer_addresses", "capacities", "location"],
    "batch_unregister_memory": None,
    "transfer_sync_write": ["target_hostname", "buffer", "peer_buffer_address", "length", "transport_hint"],
    "transfer_sync_read": ["target_hostname", "buffer", "peer_buffer_address", "length", "transport_hint"],
    "transfer_sync": ["target_hostname", "buffer", "peer_buffer_address", "length", "opcode", "notify",
                      "transport_hint"],
    "batch_transfer_sync_write": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                                  "transport_hint"],
    "batch_transfer_sync_read": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                                 "transport_hint"],
    "batch_transfer_sync": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths", "opcode", "notify",
                            "transport_hint"],
    "batch_transfer_async_write": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                                   "transport_hint"],
    "batch_transfer_async_read": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                                  "transport_hint"],
    "batch_transfer_async": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths", "opcode",
                             "transport_hint"],
    "get_batch_transfer_status": None,
    "transfer_submit_write": ["target_hostname", "buffer", "peer_buffer_address", "length", "transport_hint"],
    "transfer_check_status": None,
    "allocate_managed_buffer": None,
    "free_managed_buffer": None,
    "write_bytes_to_buffer": None,
    "read_bytes_from_buffer": None,
    "get_first_buffer_address": None,
    "get_notifies": [],
    "send_probe": ["peer_server_name"],
    "get_local_topology": ["device_name"],
    "get_engine": [],
    "get_engine_ptr": [],
}

STORE = {
    "setup": None,
    "get_hostname": [],
    "close": [],
    "health_check": [],
    "register_buffer": ["buffer_ptr", "size"],
    "unregister_buffer": ["buffer_ptr"],
    "put": ["key", "value", "config"],
    "upsert": ["key", "value", "config"],
    "put_parts": ["key"],
    "upsert_parts": ["key"],
    "put_batch": ["keys", "values", "config"],
    "upsert_batch": ["keys", "values", "config"],
    "get": None,
    "get_batch": None,
    "get_buffer": None,
    "batch_get_buffer": None,
    "get_size": None,
    "is_exist": None,
    "batch_is_exist": ["keys"],
    "remove": ["key", "force"],
    "batch_remove": ["keys", "force"],
    "remove_all": ["force"],
    "remove_by_regex": ["regex", "force"],
    "put_from": ["key", "buffer_ptr", "size", "config"],
    "upsert_from": ["key", "buffer_ptr", "size", "config"],
    "put_from_with_metadata": ["key", "buffer_ptr", "metadata_buffer_ptr", "size", "metadata_size", "config"],
    "get_into": ["key", "buffer_ptr", "size"],
    "batch_put_from": ["keys", "buffer_ptrs", "sizes", "config"],
    "batch_upsert_from": ["keys", "buffer_ptrs", "sizes", "config"],
    "batch_get_into": ["keys", "buffer_ptrs", "sizes"],
    "batch_put_from_multi_buffers": ["keys", "all_buffer_ptrs", "all_sizes", "config"],
    "batch_get_into_multi_buffers": ["keys", "all_buffer_ptrs", "all_sizes", "prefer_alloc_in_same_node"],
}


@pytest.mark.parametrize("cls,table", [(TransferEngine, ENGINE), (MooncakeDistributedStore, STORE)],
                         ids=["engine", "store"])
def test_method_names_and_keywords(cls, table):
    for name, params in table.items():
        fn = getattr(cls, name, None)
        assert callable(fn), f"{cls.__name__}.{name} is missing"
        if params is None:
            continue
        got = [p for p in inspect.signature(fn).parameters][1:]  # after self
        assert got[:len(params)] == params, f"{cls.__name__}.{name}{tuple(got)}"


def test_types():
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1
    n = TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b")
    rc = ReplicateConfig()
    assert rc.replica_num == 1 and rc.preferred_segment == "" and not rc.with_hard_pin
    assert mooncake.IMPLEMENTATION == "mooncake-go"


def test_library_is_bundled():
    """The installed package carries its own libmooncake.so (unless the
    environment points elsewhere on purpose)."""
    if os.environ.get("MOONCAKE_GO_LIBRARY"):
        pytest.skip("MOONCAKE_GO_LIBRARY overrides the bundled library")
    lib = Path(mooncake_go.library_path)
    assert lib.parent == Path(mooncake_go.__file__).parent and lib.name == "libmooncake.so"
    assert mooncake_go.abi_version >> 16 == 1

"""The installed package: the bundled library, and the compat modules'
method names and keyword arguments, as the official bindings name them
(callers pass many of them by keyword)."""

from __future__ import annotations

import inspect
import os
import re
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
    "remove_by_regex": ["regex_pattern", "force"],
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


# -- the whole surface against the official wheel -------------------------

# Run in the official wheel's venv: every public name of mooncake.engine
# and mooncake.store, with the parameter names of each callable as its
# pybind11 signature line gives them (None: not a callable or no signature).
_DUMP = r'''
import inspect, json, re
import mooncake.engine, mooncake.store

def params(obj):
    doc = (getattr(obj, "__doc__", None) or "").strip()
    m = re.match(r"\w+\((.*?)\)\s*->", doc.splitlines()[0]) if doc else None
    if not m or "Overloaded" in doc.splitlines()[0]:
        return None
    out = []
    for p in re.split(r",\s*(?![^\[]*\])", m.group(1)):
        name = p.split(":")[0].split("=")[0].strip()
        if name and name != "self":
            out.append(name)
    return out

surface = {}
for mod in (mooncake.engine, mooncake.store):
    for n in dir(mod):
        if n.startswith("_"):
            continue
        o = getattr(mod, n)
        key = f"{mod.__name__}.{n}"
        surface[key] = params(o) if callable(o) and not inspect.isclass(o) else None
        if inspect.isclass(o) and type(o).__name__ == "pybind11_type" and not hasattr(o, "__members__"):
            for m, a in vars(o).items():
                if not m.startswith("_"):
                    surface[f"{key}.{m}"] = params(a) if callable(a) else None
print(json.dumps(surface))
'''


def _official_surface():
    venv = Path(__file__).resolve().parents[2] / ".venv-official" / "bin" / "python"
    if not venv.exists():
        pytest.skip(f"{venv} is missing: run scripts/test-deps.sh")
    import json
    import subprocess
    r = subprocess.run([str(venv), "-I", "-c", _DUMP], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ours(name: str):
    """Our object of that name; a member the official class has as a
    property may be an instance attribute here, so an instance made
    without arguments is asked too."""
    import importlib
    parts = name.split(".")
    obj = importlib.import_module(".".join(parts[:2]))
    for p in parts[2:]:
        try:
            obj = getattr(obj, p)
        except AttributeError:
            if not inspect.isclass(obj):
                raise
            obj = getattr(obj(), p)
    return obj


def test_surface_matches_official():
    """Every public name of the official mooncake.engine and mooncake.store
    (0.3.13.post1) exists here with the same parameter names, or is listed
    with its reason in mooncake._surface_exceptions."""
    from mooncake._surface_exceptions import EXCEPTIONS
    official = _official_surface()
    missing, mismatched = [], []
    for name, params in sorted(official.items()):
        if name in EXCEPTIONS or name.rsplit(".", 1)[0] in EXCEPTIONS:
            continue
        try:
            obj = _ours(name)
        except AttributeError:
            missing.append(name)
            continue
        if params is None or not callable(obj):
            continue
        named = [p for p in params if not re.fullmatch(r"arg\d+|\*args|\*\*kwargs", p)]
        if len(named) != len(params):
            continue  # positional-only in the official binding: names are free
        try:
            got = [p for p in inspect.signature(obj).parameters if p != "self"]
        except ValueError:
            mismatched.append(f"{name}: ours has no Python signature")
            continue
        if got[:len(params)] != params:
            mismatched.append(f"{name}: official {params}, ours {got}")
    assert not missing, "missing from mooncake-go (implement or add to _surface_exceptions): " + ", ".join(missing)
    assert not mismatched, "\n".join(mismatched)
    # Every exception names something the official module has, with a reason.
    stale = [n for n in EXCEPTIONS if n not in official]
    # and nothing listed there is served after all.
    served = []
    for n in EXCEPTIONS:
        try:
            _ours(n)
            served.append(n)
        except AttributeError:
            pass
    assert not served, f"listed as exceptions but present: {served}"
    assert not stale, f"exceptions for names the official module lacks: {stale}"
    assert all(isinstance(r, str) and len(r) > 10 for r in EXCEPTIONS.values())

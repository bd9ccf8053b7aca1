"""LMCache's MooncakeLookupClient (the scheduler-side lookup of
`external_lookup_client: mooncakestore://<master>`), made by LMCache's
LookupClientFactory: a store client of its own (no segment) that asks
batch_is_exist for a prompt's chunk keys and answers how many leading tokens
the store holds. The chunks are written by LMCache's RemoteBackend (another
client of the same cluster), so the test also shows that the keys the two
sides derive from the tokens meet in the store."""

from __future__ import annotations

import threading

import pytest
from lmcharness import CHUNK, chunk_keys, engine_config, fill, metadata, mooncake_settings, random_tokens
from lmcache.v1.lookup_client.factory import LookupClientFactory
from lmcache.v1.lookup_client.mooncake_lookup_client import MooncakeLookupClient
from lmcache.v1.storage_backend import CreateStorageBackends

from mooncake.store import MooncakeDistributedStore

WAIT = 60


@pytest.fixture(scope="module")
def writer(cluster, loop):
    """LMCache's RemoteBackend (zero-copy mode) that stores the chunks."""
    extra = {"save_chunk_meta": False, "transfer_timeout": WAIT}
    extra.update({"mooncake_" + k: v for k, v in mooncake_settings(cluster.master).items()})
    cfg = engine_config(remote_url="mooncakestore://127.0.0.1:50051/", extra_config=extra)
    made = CreateStorageBackends(cfg, metadata(), loop)
    assert made["RemoteBackend"].connection is not None
    yield cfg, made["LocalCPUBackend"], made["RemoteBackend"]
    made["RemoteBackend"].close()
    made["LocalCPUBackend"].close()


def store_prompt(writer, tokens) -> list:
    """Writes every chunk of tokens through LMCache; returns their keys."""
    cfg, cpu, remote = writer
    md = metadata()
    chunks = chunk_keys(tokens, cfg)
    objs = []
    for i, (start, end, _) in enumerate(chunks):
        obj = cpu.allocate(md.get_shapes(end - start), md.get_dtypes())
        fill(obj, i)
        objs.append(obj)
    done = threading.Semaphore(0)
    keys = [k for _, _, k in chunks]
    remote.batched_submit_put_task(keys, objs, on_complete_callback=lambda k: done.release())
    for _ in keys:
        assert done.acquire(timeout=WAIT), "LMCache's batched put did not complete"
    for obj in objs:
        obj.ref_count_down()
    assert all(remote.contains(k) for k in keys)
    return keys


@pytest.fixture(scope="module")
def lookup(cluster, writer):
    cfg = engine_config(external_lookup_client=f"mooncakestore://{cluster.master}")
    client = LookupClientFactory.create_lookup_client(cfg, metadata())
    assert isinstance(client, MooncakeLookupClient)
    yield client
    client.close()


def test_lookup_counts_stored_prefix(writer, lookup):
    prompt = random_tokens(4 * CHUNK, 7)
    store_prompt(writer, prompt)
    assert lookup.lookup(prompt) == 4 * CHUNK
    assert lookup.lookup(prompt[:2 * CHUNK]) == 2 * CHUNK
    # The third chunk differs from the stored one: two chunks hit.
    diverged = prompt[:2 * CHUNK] + random_tokens(2 * CHUNK, 8)
    assert lookup.lookup(diverged) == 2 * CHUNK


def test_lookup_misses(cluster, writer, lookup):
    """Negative controls: tokens never stored hit nothing, and a chunk
    removed from the store (by a third client) ends the hit there."""
    assert lookup.lookup(random_tokens(4 * CHUNK, 9)) == 0
    prompt = random_tokens(4 * CHUNK, 10)
    keys = store_prompt(writer, prompt)
    assert lookup.lookup(prompt) == 4 * CHUNK
    other = MooncakeDistributedStore()
    assert other.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.master) == 0
    try:
        # force: the lookups just now leased the object (as Mooncake's ExistKey does).
        assert other.remove(keys[1].to_string(), force=True) == 0
    finally:
        other.close()
    assert lookup.lookup(prompt) == CHUNK

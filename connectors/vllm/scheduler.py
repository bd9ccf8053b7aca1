"""The connector's scheduler side (vLLM's engine core process): decides
what each request loads, saves and hands to a decode instance, and asks the
store which blocks it holds."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional, Set, Tuple

from mooncake_go import MooncakeError, Store

from .config import Settings, block_key, key_prefix
from .jobs import NULL_BLOCK, LoadJob, PullJob, SaveJob, Step

# A child of vLLM's logger: its handler, format and VLLM_LOGGING_LEVEL apply.
logger = logging.getLogger("vllm.mooncake_go_connector")


class SchedulerSide:
    def __init__(self, vllm_config, settings: Settings):
        self.settings = settings
        self.block_size = vllm_config.cache_config.block_size
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        # The scheduler asks for rank 0's keys: every rank saves its shard
        # of the same blocks.
        self.prefix = key_prefix(vllm_config.model_config.model, 0, settings.tenant, settings.key_prefix)
        self._store: Optional[Store] = None
        self._store_down_until = 0.0
        self._workers: Dict[int, Any] = {}  # tp rank -> MooncakeGoHandshake
        self._reqs: Dict[str, Any] = {}  # requests seen, until they finish
        self._plans: Dict[str, Tuple] = {}  # what get_num_new_matched_tokens found
        self._loaded: Dict[str, range] = {}  # block indices loaded from the store
        # Requests that had their store load: one each. A failed load has
        # vLLM ask again, and the store still lists the blocks it could
        # not read; asking again would load and fail forever.
        self._load_tried: Set[str] = set()
        self._save_emitted: Set[str] = set()  # every full prompt block saved
        # Prompt blocks sent to be saved, per request: a block is saved in
        # the step that completes it, while the request surely holds it (a
        # sliding window frees blocks once they fall out of it, and vLLM
        # puts its null block in their place).
        self._saved_upto: Dict[str, int] = {}
        self._saving: Set[str] = set()  # save sent to the worker: free late
        self._step = Step()
        # vLLM's KV cache manager, bound after construction by releases that
        # have bind_kv_cache_manager (0.32 on). Older ones (0.26, the last
        # for torch 2.11) never bind it: the block ids of each request are
        # then followed from the scheduler's outputs instead.
        self._kv_cache_manager = None
        self._block_ids: Dict[str, list] = {}

    # -- the store -------------------------------------------------------

    def _lookup_store(self) -> Optional[Store]:
        """The store client for lookups, or None while the store is down."""
        if self._store is not None:
            return self._store
        if time.monotonic() < self._store_down_until:
            return None
        try:
            self._store = Store(self.settings.master, segment_size=-1, local_buffer_size=1 << 20,
                                local_hostname=self.settings.host,
                                rpc_timeout_ms=int(self.settings.lookup_timeout * 1000))
        except MooncakeError as e:
            self._store_failed(e)
        return self._store

    def _store_failed(self, e: Exception) -> None:
        logger.warning("mooncake-go connector: store at %s unavailable (%s); lookups pause for %.0f s",
                       self.settings.master, e, self.settings.store_retry)
        self._store_down_until = time.monotonic() + self.settings.store_retry
        if self._store is not None:
            store, self._store = self._store, None
            try:
                store.close()
            except MooncakeError:
                pass

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- vLLM's scheduler hooks -----------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[int, bool]:
        rid = request.request_id
        self._reqs[rid] = request
        self._plans.pop(rid, None)
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill") and params.get("remote_workers"):
            # The prompt's KV waits on the prefill instance: all of it but
            # what this instance already holds.
            count = request.num_prompt_tokens - num_computed_tokens
            if count <= 0 or num_computed_tokens % self.block_size:
                return 0, False
            self._plans[rid] = ("pd", num_computed_tokens // self.block_size, params)
            return count, True
        if not (self.settings.load and self.settings.master) or num_computed_tokens % self.block_size:
            return 0, False
        if rid in self._load_tried:
            return 0, False
        start = num_computed_tokens // self.block_size
        hashes = request.block_hashes[start:request.num_prompt_tokens // self.block_size]
        if not hashes:
            return 0, False
        store = self._lookup_store()
        if store is None:
            return 0, False
        keys = [block_key(self.prefix, h) for h in hashes]
        try:
            present = store.batch_exists(keys)
        except MooncakeError as e:
            self._store_failed(e)
            return 0, False
        n = 0
        while n < len(present) and present[n]:
            n += 1
        if n == 0:
            return 0, False
        self._plans[rid] = ("store", start, keys[:n])
        return n * self.block_size, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        plan = self._plans.pop(rid, None)
        params = request.kv_transfer_params or {}
        pd = bool(params.get("do_remote_prefill") and params.get("remote_workers"))
        if num_external_tokens == 0 or plan is None:
            if pd:
                # Nothing to pull, but the prefill instance still holds the blocks.
                params["do_remote_prefill"] = False
                self._step.pulls.append(PullJob(rid, [], [], str(params.get("remote_request_id", "")),
                                                list(params["remote_workers"])))
            return
        ids = group_ids(blocks)
        kind, start, what = plan
        if kind == "store":
            n = len(what)
            # Places a sliding window skips hold vLLM's null block: nothing
            # reads them, so nothing is loaded there.
            pairs = [(k, b) for k, b in zip(what, ids[start:start + n]) if b is not None]
            self._step.loads.append(LoadJob(rid, [k for k, _ in pairs], [b for _, b in pairs]))
            self._load_tried.add(rid)
            self._loaded[rid] = range(start, start + n)
            return
        end = -(-request.num_prompt_tokens // self.block_size)
        remote = list(what.get("remote_block_ids") or [])[start:end]
        local = ids[start:end]
        if len(local) == len(remote):
            pairs = [(b, r) for b, r in zip(local, remote) if b is not None]
            local, remote = [b for b, _ in pairs], [r for _, r in pairs]
        # Pulled once: a preempted request recomputes instead.
        params["do_remote_prefill"] = False
        self._step.pulls.append(PullJob(rid, local, remote, str(what.get("remote_request_id", "")),
                                        list(what["remote_workers"])))

    def build_connector_meta(self, scheduler_output) -> Step:
        if self.settings.save and self.settings.master:
            self._emit_saves(scheduler_output)
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            if rid in self._saving:
                self._step.preempted.append(rid)
        step, self._step = self._step, Step()
        return step

    def _follow_block_ids(self, out) -> None:
        """Keeps each request's block ids (first KV cache group) from a
        step's scheduler output, for vLLM releases that bind no KV cache
        manager: a new request brings all of its blocks, a running one the
        blocks added this step, a resumed one all of them again. vLLM's
        null block (a sliding window's skipped places, in a prefix cache
        hit) is None, as group_ids has it."""
        for r in out.scheduled_new_reqs:
            self._block_ids[r.req_id] = _nulls_none(r.block_ids[0])
        cached = out.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None)
        if resumed is None:  # releases before 0.26 flag each request
            flags = getattr(cached, "resumed_from_preemption", None) or [False] * len(cached.req_ids)
            resumed = {rid for rid, f in zip(cached.req_ids, flags) if f}
        for i, rid in enumerate(cached.req_ids):
            new = cached.new_block_ids[i]
            if rid in resumed:
                self._block_ids[rid] = _nulls_none(new[0]) if new is not None else []
            elif new is not None:
                self._block_ids.setdefault(rid, []).extend(_nulls_none(new[0]))

    def _emit_saves(self, out) -> None:
        """Saves the full prompt blocks this step completes, of every
        request (the worker writes them once the step's forward pass has
        filled them): a chunked prompt's blocks chunk by chunk."""
        computed = {}
        for r in out.scheduled_new_reqs:
            computed[r.req_id] = r.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
        mgr = self._kv_cache_manager
        if mgr is None:
            self._follow_block_ids(out)
        for rid, n in out.num_scheduled_tokens.items():
            req = self._reqs.get(rid)
            if req is None or rid in self._save_emitted or rid not in computed:
                continue
            done = min(computed[rid] + n, req.num_prompt_tokens)
            if done == req.num_prompt_tokens:
                self._save_emitted.add(rid)
            first = self._saved_upto.get(rid, 0)
            full = min(done // self.block_size, len(req.block_hashes))
            if full <= first:
                continue
            self._saved_upto[rid] = full
            ids = group_ids(mgr.get_blocks(rid)) if mgr is not None else self._block_ids.get(rid, [])
            skip = self._loaded.get(rid, range(0))
            picks = [i for i in range(first, min(full, len(ids))) if i not in skip and ids[i] is not None]
            if picks:
                self._step.saves.append(SaveJob(rid, [block_key(self.prefix, req.block_hashes[i]) for i in picks],
                                                [ids[i] for i in picks]))
                self._saving.add(rid)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        rid = request.request_id
        self._reqs.pop(rid, None)
        self._plans.pop(rid, None)
        self._loaded.pop(rid, None)
        self._load_tried.discard(rid)
        self._save_emitted.discard(rid)
        self._saved_upto.pop(rid, None)
        self._block_ids.pop(rid, None)
        delay = rid in self._saving
        self._saving.discard(rid)
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_decode") or not self._workers or _aborted(request):
            return delay, None
        if block_ids and isinstance(block_ids[0], (list, tuple)):
            block_ids = block_ids[0]
        self._step.holds[rid] = self.settings.pd_free_timeout
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": rid,
            "remote_block_ids": list(block_ids),
            "remote_workers": [{"engine": w.engine, "runs": [list(r) for r in w.runs],
                                "order": [list(o) for o in w.order]}
                               for _, w in sorted(self._workers.items())],
        }

    def set_workers(self, metadata: Dict[int, Any]) -> None:
        self._workers = dict(metadata)


def group_ids(blocks) -> list:
    """The block ids of vLLM's KVCacheBlocks in the first KV cache group,
    None where it holds vLLM's null block: the places of a sliding window
    that fell out of it, or that it skipped."""
    ids = list(blocks.get_block_ids()[0])
    for i, b in enumerate((getattr(blocks, "blocks", None) or [()])[0]):
        if getattr(b, "is_null", False):
            ids[i] = None
    return ids


def _nulls_none(ids) -> list:
    """Block ids from a scheduler output, None where vLLM's null block is."""
    return [None if b == NULL_BLOCK else b for b in ids]


def _aborted(request) -> bool:
    from vllm.v1.request import RequestStatus

    return request.status == RequestStatus.FINISHED_ABORTED

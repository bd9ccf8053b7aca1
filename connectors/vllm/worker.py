"""The connector's worker side (each vLLM worker process): registers the KV
cache once with a Transfer Engine (PD pulls) and a store client (the store
tier), and moves blocks on two threads, so the engine's steps never wait
on the network: one saves, one loads and pulls. Every move is bounded (the
store's RPC deadline and the engine's per-request deadline are the
connector's load_timeout), and a job that waited in the queue past its
deadline fails without running: vLLM then recomputes the blocks."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from mooncake_go import MooncakeError, Op, RequestArray, Store, TransferEngine
from mooncake_go.errors import ObjectAlreadyExists

from .config import Settings, key_prefix
from .jobs import NULL_BLOCK, LoadJob, PullJob, SaveJob, Step
from .layout import Layout, compute_fence, remote_mismatch, remote_parts

# A child of vLLM's logger: its handler, format and VLLM_LOGGING_LEVEL apply.
logger = logging.getLogger("vllm.mooncake_go_connector")

#: The notification a decode instance sends the prefill instance once it
#: pulled a request's blocks (msg: the prefill's request id).
FREE = "mooncake-go/vllm-free"


class WorkerSide:
    def __init__(self, vllm_config, settings: Settings, num_blocks: int, fence_saves: bool = False):
        self.settings = settings
        self.num_blocks = num_blocks
        # vLLM frees blocks of running requests (a sliding window's, once
        # they fall out of it) and may refill them in the next step: each
        # step then starts once the saves before it no longer read blocks.
        self.fence_saves = fence_saves
        if fence_saves:
            logger.info("mooncake-go connector: vLLM frees blocks of running requests (a sliding window); "
                        "each step waits for the saves of the steps before it")
        self.block_size = vllm_config.cache_config.block_size
        self.tp_rank = _tp_rank()
        self.prefix = key_prefix(vllm_config.model_config.model, self.tp_rank, settings.tenant, settings.key_prefix)
        self.layout: Optional[Layout] = None
        self.engine: Optional[TransferEngine] = None
        self._store: Optional[Store] = None
        self._store_engine: Optional[TransferEngine] = None
        self._store_down_until = 0.0
        self._lock = threading.Lock()
        self._saved = threading.Condition(self._lock)  # a save job ended
        self._saving: Dict[str, int] = {}  # request -> save jobs not done
        self._tainted: Set[str] = set()  # preempted while saving: drop what they stored
        self._delayed: Set[str] = set()  # requests whose blocks vLLM keeps for us
        self._finished: Set[str] = set()  # of those, the ones vLLM finished
        self._holds: Dict[str, float] = {}  # request -> deadline of the decode's pull
        self._freed: Dict[str, float] = {}  # FREE notices received -> when
        self._recv_done: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._saves: "queue.Queue" = queue.Queue()
        self._loads: "queue.Queue" = queue.Queue()
        self._threads: List[threading.Thread] = []

    # -- setup -----------------------------------------------------------

    def register_kv_caches(self, kv_caches) -> None:
        self.layout = Layout(kv_caches, self.num_blocks)
        timeout_ms = int(self.settings.load_timeout * 1000)
        self.engine = TransferEngine(host=self.settings.host, timeout_ms=timeout_ms)
        for addr, n in self.layout.regions:
            self.engine.register_memory(addr, n)
        logger.info("mooncake-go connector: %d layers, %d runs, %d bytes per block; engine %s",
                    len(self.layout.layers), len(self.layout.runs), self.layout.block_bytes, self.engine.name)
        for name, q, fn in (("save", self._saves, self._save), ("load", self._loads, self._load_or_pull)):
            t = threading.Thread(target=self._serve, args=(q, fn), name=f"mooncake-go-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _store_client(self) -> Optional[Store]:
        """The store client with the KV cache registered, or None while the
        store is down or not configured (called from the worker threads)."""
        s = self.settings
        if not s.master or self.layout is None:
            return None
        with self._lock:
            if self._store is not None:
                return self._store
            if time.monotonic() < self._store_down_until:
                return None
            try:
                self._store_engine = TransferEngine(host=s.host, timeout_ms=int(s.load_timeout * 1000))
                self._store = Store(s.master, segment_size=s.segment_size if s.segment_size > 0 else -1,
                                    local_buffer_size=s.local_buffer_size, local_hostname=s.host,
                                    rpc_timeout_ms=int(s.load_timeout * 1000), engine=self._store_engine)
                for addr, n in self.layout.regions:
                    self._store.register_buffer(addr, n)
            except MooncakeError as e:
                self._drop_store_locked(e)
            return self._store

    def _store_failed(self, e: Exception) -> None:
        with self._lock:
            self._drop_store_locked(e)

    def _drop_store_locked(self, e: Exception) -> None:
        logger.warning("mooncake-go connector: store at %s unavailable (%s); the store tier pauses for %.0f s",
                       self.settings.master, e, self.settings.store_retry)
        self._store_down_until = time.monotonic() + self.settings.store_retry
        store, self._store = self._store, None
        eng, self._store_engine = self._store_engine, None
        for h in (store, eng):
            if h is not None:
                try:
                    h.close()
                except MooncakeError:
                    pass

    # -- vLLM's worker hooks ---------------------------------------------

    def before_step(self, step: Step) -> None:
        """vLLM's handle_preemptions, called before the step writes any
        block (its forward pass; its loads, queued by start_step, which
        vLLM 0.32 calls only after launching the forward): waits for the
        saves of the requests it preempted, and with fence_saves for every
        save of the steps before."""
        if self.fence_saves:
            with self._lock:
                rids = [r for r, n in self._saving.items() if n]
            if rids:
                self.wait_saves(rids, "may have had blocks freed by a sliding window")
        elif step.preempted:
            self.wait_saves(step.preempted)

    def start_step(self, step: Step) -> None:
        """Queues the step's loads and pulls, and notes its holds."""
        now = time.monotonic()
        deadline = now + self.settings.load_timeout
        with self._lock:
            for rid, timeout in step.holds.items():
                self._holds[rid] = now + timeout
                self._delayed.add(rid)
        for job in step.loads:
            self._loads.put((deadline, job))
        for job in step.pulls:
            self._loads.put((deadline, job))

    def save_step(self, step: Step) -> None:
        """Queues the step's saves; each waits for the step's forward pass
        to have written its blocks on the device (compute_fence)."""
        fence = compute_fence(self.layout) if self.layout is not None else None
        with self._lock:
            for job in step.saves:
                self._saving[job.req_id] = self._saving.get(job.req_id, 0) + 1
                self._delayed.add(job.req_id)
        for job in step.saves:
            self._saves.put((fence, job))

    def wait_saves(self, rids, why: str = "were preempted") -> None:
        """Waits until the saves of rids no longer read their blocks (vLLM
        preempted them, or freed some of their blocks, and reuses the
        blocks after this call). A save is bounded by the store's
        deadlines; past twice load_timeout the connector stops waiting and
        says so, and removes what those saves store."""
        deadline = time.monotonic() + 2 * self.settings.load_timeout
        with self._lock:
            while any(self._saving.get(r) for r in rids):
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning("mooncake-go connector: saves of requests %s, which %s, still running; "
                                   "what they store will be removed", list(rids), why)
                    self._tainted.update(r for r in rids if self._saving.get(r))
                    return
                self._saved.wait(left)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        self._take_notices()
        now = time.monotonic()
        done = set()
        with self._lock:
            self._finished |= finished_req_ids & self._delayed
            for rid in self._finished:
                if self._saving.get(rid):
                    continue
                deadline = self._holds.get(rid)
                if deadline is not None and rid not in self._freed:
                    if now < deadline:
                        continue
                    logger.warning("mooncake-go connector: no decode instance pulled request %s in %.0f s; "
                                   "freeing its blocks", rid, self.settings.pd_free_timeout)
                elif deadline is not None:
                    logger.info("mooncake-go connector: request %s freed after the decode pulled it", rid)
                done.add(rid)
            for rid in done:
                self._finished.discard(rid)
                self._delayed.discard(rid)
                self._holds.pop(rid, None)
                self._freed.pop(rid, None)
                self._saving.pop(rid, None)
            # Notices for requests this instance no longer knows.
            stale = now - 2 * self.settings.pd_free_timeout
            for rid in [r for r, t in self._freed.items() if t < stale]:
                del self._freed[rid]
            recv, self._recv_done = self._recv_done, set()
        return done or None, recv or None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            errs, self._load_errors = self._load_errors, set()
        return errs

    def _take_notices(self) -> None:
        if self.engine is None:
            return
        try:
            notes = self.engine.get_notifies()
        except MooncakeError as e:
            logger.warning("mooncake-go connector: reading notifications failed: %s", e)
            return
        now = time.monotonic()
        with self._lock:
            for n in notes:
                if n.name == FREE:
                    self._freed[n.msg] = now

    def shutdown(self) -> None:
        for q in (self._saves, self._loads):
            q.put(None)
        for t in self._threads:
            t.join(timeout=self.settings.load_timeout + 5)
        with self._lock:
            store, self._store = self._store, None
        for h in (store, self._store_engine, self.engine):
            if h is not None:
                h.close()

    # -- the threads -----------------------------------------------------

    def _serve(self, q: "queue.Queue", fn) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            arg, job = item  # loads: a deadline; saves: a fence
            try:
                fn(job, arg)
            except Exception:  # a bug must not stop the thread: vLLM would wait forever
                logger.exception("mooncake-go connector: %s of request %s failed", type(job).__name__, job.req_id)
                if not isinstance(job, SaveJob):  # a save counts itself done (_save's finally)
                    self._recv_failed(job.req_id, job.block_ids)

    def _save(self, job: SaveJob, fence) -> None:
        try:
            store = self._store_client()
            if store is None:
                return
            if fence is not None:
                fence.synchronize()  # the forward pass has written the blocks
            addrs, lens = zip(*(self.layout.parts(b) for b in job.block_ids))
            try:
                res = store.batch_put_from_parts(job.keys, list(addrs), list(lens))
            except MooncakeError as e:
                self._store_failed(e)
                return
            stored = sum(r is None for r in res)
            had = sum(isinstance(r, ObjectAlreadyExists) for r in res)
            bad = [r for r in res if r is not None and not isinstance(r, ObjectAlreadyExists)]
            with self._lock:
                tainted = job.req_id in self._tainted
            if tainted:
                # vLLM reused the blocks while they were being read.
                mine = [k for k, r in zip(job.keys, res) if r is None]
                store.batch_remove(mine, force=True)
                logger.warning("mooncake-go connector: removed the %d blocks request %s saved after its "
                               "preemption", len(mine), job.req_id)
                return
            logger.info("mooncake-go connector: saved %d blocks of request %s to the store (%d were there)",
                        stored, job.req_id, had)
            if bad:
                logger.warning("mooncake-go connector: %d blocks of request %s not saved: %s",
                               len(bad), job.req_id, bad[0])
        finally:
            self._save_done(job.req_id)

    def _save_done(self, rid: str) -> None:
        with self._lock:
            if self._saving.get(rid):
                self._saving[rid] -= 1
            if not self._saving.get(rid):
                self._tainted.discard(rid)
            self._saved.notify_all()

    def _load_or_pull(self, job, deadline: float) -> None:
        if time.monotonic() > deadline:
            logger.warning("mooncake-go connector: %s of request %s waited past its deadline; vLLM recomputes",
                           type(job).__name__, job.req_id)
            self._recv_failed(job.req_id, job.block_ids)
            return
        if isinstance(job, PullJob):
            self._pull(job)
        else:
            self._load(job)

    def _load(self, job: LoadJob) -> None:
        store = self._store_client()
        if store is None:
            self._recv_failed(job.req_id, job.block_ids)
            return
        addrs, lens = zip(*(self.layout.parts(b) for b in job.block_ids))
        try:
            res = store.batch_get_into_parts(job.keys, list(addrs), list(lens))
        except MooncakeError as e:
            self._store_failed(e)
            self._recv_failed(job.req_id, job.block_ids)
            return
        good = 0
        while good < len(res) and res[good] == self.layout.block_bytes:
            good += 1
        if good < len(res):
            logger.warning("mooncake-go connector: loading block %d of request %s from the store failed (%s); "
                           "vLLM recomputes from there", good, job.req_id, res[good])
        logger.info("mooncake-go connector: loaded %d blocks (%d tokens) of request %s from the store",
                    good, good * self.block_size, job.req_id)
        self._recv_finished(job.req_id, job.block_ids[good:])

    def _pull(self, job: PullJob) -> None:
        seg = None
        try:
            if self.tp_rank >= len(job.workers):
                raise ValueError(f"the prefill instance has {len(job.workers)} workers, this is rank {self.tp_rank}")
            w = job.workers[self.tp_rank]
            runs = w["runs"]
            why = remote_mismatch(self.layout, w)
            if why is not None:
                raise ValueError(why)
            if len(job.remote_block_ids) != len(job.block_ids):
                raise ValueError(f"{len(job.remote_block_ids)} remote blocks for {len(job.block_ids)} local ones")
            if NULL_BLOCK in job.remote_block_ids:
                raise ValueError("the prefill instance no longer holds every block (its sliding window freed some)")
            seg = self.engine.open_segment(w["engine"])
            locs: List[int] = []
            rems: List[int] = []
            lens: List[int] = []
            for lb, rb in zip(job.block_ids, job.remote_block_ids):
                a, n = self.layout.parts(lb)
                locs += a
                lens += n
                rems += remote_parts(runs, rb)
            self.engine.transfer(RequestArray.of(Op.READ, seg, locs, rems, lens), timeout=self.settings.load_timeout)
            logger.info("mooncake-go connector: pulled %d blocks of request %s from %s", len(job.block_ids),
                        job.req_id, w["engine"])
            self._recv_finished(job.req_id, [])
        except (MooncakeError, ValueError, KeyError, TypeError) as e:
            logger.warning("mooncake-go connector: pulling request %s's blocks failed (%s); vLLM recomputes",
                           job.req_id, e)
            self._recv_failed(job.req_id, job.block_ids)
        finally:
            if seg is not None:
                try:
                    self.engine.send_notify(seg, FREE, job.remote_request_id)
                except MooncakeError as e:
                    logger.warning("mooncake-go connector: telling %s to free request %s failed: %s",
                                   job.workers[self.tp_rank]["engine"], job.remote_request_id, e)

    def _recv_finished(self, rid: str, failed_blocks) -> None:
        with self._lock:
            self._load_errors.update(failed_blocks)
            self._recv_done.add(rid)

    def _recv_failed(self, rid: str, blocks) -> None:
        self._recv_finished(rid, blocks)


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except (ImportError, AssertionError, AttributeError):
        return 0

"""MooncakeGoConnector: vLLM's KVConnectorBase_V1 over mooncake_go. vLLM
builds one per role: the scheduler role runs scheduler.SchedulerSide, the
worker role worker.WorkerSide; this class only routes vLLM's calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorHandshakeMetadata,
                                                              KVConnectorMetadata, KVConnectorRole)

from .config import Settings
from .jobs import Step
from .scheduler import SchedulerSide
from .worker import WorkerSide


@dataclass
class MooncakeGoMetadata(Step, KVConnectorMetadata):
    """One step's jobs (jobs.Step), as vLLM carries them to the workers."""


@dataclass
class MooncakeGoHandshake(KVConnectorHandshakeMetadata):
    """What a worker tells its scheduler once its KV cache is registered:
    its engine's segment name and where its blocks are (layout.Run list,
    and the order of a block's elements in each run),
    for the kv_transfer_params of the requests a decode instance pulls."""

    engine: str = ""
    runs: List[List[int]] = field(default_factory=list)
    order: List[List[int]] = field(default_factory=list)  # layout.Layout.order


class MooncakeGoConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        kvt = vllm_config.kv_transfer_config
        settings = Settings.from_config(kvt.kv_connector_extra_config, kvt.kv_role)
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(vllm_config, settings)
        else:
            num_blocks = getattr(kv_cache_config, "num_blocks", 0) if kv_cache_config is not None else 0
            self._worker = WorkerSide(vllm_config, settings, num_blocks,
                                      fence_saves=frees_running_blocks(vllm_config, kv_cache_config))

    # -- worker side -----------------------------------------------------

    def register_kv_caches(self, kv_caches: dict) -> None:
        w = self._worker
        if not w.num_blocks:  # no KVCacheConfig (older vLLM): the leading dimension
            w.num_blocks = next(iter(kv_caches.values())).shape[0]
        w.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata) -> None:
        # Called before the step's forward (start_load_kv may come after it).
        if isinstance(kv_connector_metadata, Step):
            self._worker.before_step(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if isinstance(meta, Step):
            self._worker.start_step(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: a request runs only once its load finished.
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        # Blocks are saved whole, after the forward pass (wait_for_save).
        return

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if isinstance(meta, Step) and meta.saves:
            self._worker.save_step(meta)

    def get_finished(self, finished_req_ids: set):
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker.get_block_ids_with_load_errors()

    def get_handshake_metadata(self) -> Optional[MooncakeGoHandshake]:
        w = self._worker
        if w is None or w.engine is None:
            return None
        return MooncakeGoHandshake(engine=w.engine.name, runs=[list(r) for r in w.layout.runs],
                                   order=[list(o) for o in w.layout.order])

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.close()

    # -- scheduler side --------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._scheduler._kv_cache_manager = kv_cache_manager

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        step = self._scheduler.build_connector_meta(scheduler_output)
        return MooncakeGoMetadata(loads=step.loads, saves=step.saves, pulls=step.pulls, holds=step.holds,
                                  preempted=step.preempted)

    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: dict) -> None:
        self._scheduler.set_workers(metadata)


def frees_running_blocks(vllm_config, kv_cache_config) -> bool:
    """Whether vLLM frees blocks of requests that still run: those a sliding
    window (or chunked local attention) no longer reads. Every KV cache
    group that is not full attention does."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        return any(not isinstance(g.kv_cache_spec, FullAttentionSpec) for g in groups)
    return vllm_config.model_config.get_sliding_window() is not None

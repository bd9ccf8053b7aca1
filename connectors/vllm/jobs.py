"""What the scheduler side tells the worker side each step (plain,
picklable: it crosses from vLLM's engine core process to its workers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

#: vLLM's null block, in the places of a request's blocks that a sliding
#: window freed or skipped: always block 0 (BlockPool takes it first).
NULL_BLOCK = 0


@dataclass
class LoadJob:
    """Read keys[i] from the store into local block block_ids[i]."""

    req_id: str
    keys: List[str]
    block_ids: List[int]


@dataclass
class SaveJob:
    """Write local block block_ids[i] to the store under keys[i]."""

    req_id: str
    keys: List[str]
    block_ids: List[int]


@dataclass
class PullJob:
    """Read the prefill instance's blocks remote_block_ids[i] into local
    block block_ids[i], then tell it to free remote_request_id's blocks.
    workers[tp_rank] is {"engine": segment name, "runs": [[base, stride,
    length], ...], "order": [...]} as the prefill instance's worker of that
    rank published them (layout.Run, layout.Layout.order)."""

    req_id: str
    block_ids: List[int]
    remote_block_ids: List[int]
    remote_request_id: str
    workers: List[dict]


@dataclass
class Step:
    """One step's work. holds: requests the worker keeps until a decode
    instance pulled them (or the timeout, in seconds, passed). preempted:
    requests vLLM preempted this step whose saves may still read their
    blocks, which vLLM has freed and may refill in this step's forward."""

    loads: List[LoadJob] = field(default_factory=list)
    saves: List[SaveJob] = field(default_factory=list)
    pulls: List[PullJob] = field(default_factory=list)
    holds: Dict[str, float] = field(default_factory=dict)
    preempted: List[str] = field(default_factory=list)

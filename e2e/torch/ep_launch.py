"""Starting Mooncake EP worker processes (ep_worker.py) and collecting
what they saved: real processes, a real gloo group, real engines."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "ep_worker.py"


class Rank:
    """A running worker: its process and the file it saves results to."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_line(self, want: str, timeout: float = 120) -> None:
        """Reads stdout until the line ``want`` (the worker's readiness)."""
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not sel.select(end - time.monotonic()):
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.strip() == want:
                return
        raise AssertionError(f"rank {self.spec['rank']} never printed {want!r}: {self.stderr()}")

    def result(self, timeout: float = 180) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"rank {self.spec['rank']} hung: {err[-3000:]}")
        if self.proc.returncode != 0:
            raise AssertionError(f"rank {self.spec['rank']} exited {self.proc.returncode}: {err[-3000:]}")
        return torch.load(self.spec["out"])

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


def start(tmp: Path, cfg, steps: int = 1, timeout_us: int = 5_000_000, backend: str = "gloo",
          extra: Optional[Dict[int, dict]] = None, common: Optional[dict] = None) -> List[Rank]:
    """Starts cfg.world workers sharing a FileStore group in tmp."""
    ranks = []
    for r in range(cfg.world):
        spec = {"rank": r, "world": cfg.world, "init": f"file://{tmp}/store", "backend": backend,
                "out": str(tmp / f"rank{r}.pt"), "cfg": dataclasses.asdict(cfg), "steps": steps,
                "timeout_us": timeout_us}
        spec.update(common or {})
        spec.update((extra or {}).get(r, {}))
        ranks.append(Rank(spec))
    return ranks


def run(tmp: Path, cfg, **kw) -> List[dict]:
    """Starts the workers and returns every rank's results."""
    ranks = start(tmp, cfg, **kw)
    try:
        return [r.result() for r in ranks]
    finally:
        for r in ranks:
            r.kill()


def env_ok() -> Optional[str]:
    """Why the EP tests cannot run here, or None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return "torch.distributed is missing"
    if not dist.is_gloo_available():
        return "torch has no gloo backend"
    if os.environ.get("MOONCAKE_GO_LIBRARY") is None:
        try:
            import mooncake_go._lib as lib

            lib._find_library()
        except ImportError as e:
            return str(e)
    return None

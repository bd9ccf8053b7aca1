"""LMCache suite fixtures: the event loop LMCache's storage backends submit
their connector calls to (its engine runs one in a thread of its own).

LMCache imports on a host without a GPU (it picks a CPU stub device), so the
suite drives LMCache's own code, unchanged, over our `mooncake` package and a
real `mooncake up` (the `cluster` fixture of e2e/conftest.py). Helpers are in
lmcharness.py.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def loop():
    """The asyncio loop LMCache's backends submit their connector calls to."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, name="lmcache-loop", daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(10)
    lp.close()


def pytest_configure(config):
    # LMCache's logging setup uses opentelemetry-sdk's deprecated
    # LoggingHandler: one warning per logger, none of them ours.
    config.addinivalue_line("filterwarnings",
                            "ignore:.*LoggingHandler.*:DeprecationWarning:opentelemetry")

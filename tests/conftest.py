"""Hypothesis profiles: ``ci`` (default, quick), ``dev``, ``deep`` and ``crosshair``.

Pick one with ``HYPOTHESIS_PROFILE=dev pytest``.  ``crosshair`` (registered only
when ``hypothesis-crosshair`` is installed) draws examples by symbolic execution
instead of at random, so branches random inputs rarely reach get solved for.
``KVPOOL_EXAMPLE_DB`` names a directory shared between machines so a failure
found on one replays on all.
"""

from __future__ import annotations

import importlib.util
import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_db = os.environ.get("KVPOOL_EXAMPLE_DB")
_common = {"database": DirectoryBasedExampleDatabase(_db)} if _db else {}

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
settings.register_profile("dev", max_examples=300, deadline=None, **_common)
settings.register_profile("deep", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
if importlib.util.find_spec("hypothesis_crosshair_provider") is not None:
    # Solver-driven paths are slow and vary in length: no deadline, fewer examples.
    settings.register_profile("crosshair", backend="crosshair", max_examples=40, deadline=None,
                              suppress_health_check=list(HealthCheck), **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

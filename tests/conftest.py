"""Hypothesis profiles: ``ci`` (default, quick), ``dev``, ``deep`` and ``crosshair``.

Pick one with ``HYPOTHESIS_PROFILE=dev pytest``.  ``crosshair`` (registered only
when ``hypothesis-crosshair`` is installed) draws examples by symbolic execution
instead of at random, so branches random inputs rarely reach get solved for.
``KVPOOL_EXAMPLE_DB`` names the example database: a directory, or
``redis://HOST:PORT/N`` shared between machines so a failure found on one replays
first on all (``kvpool.oracle.database``).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from kvpool.oracle.database import example_database, from_env

# Tests are no package: the helpers shared by several test files (impl_helpers.py) are
# imported by name from this folder, their asserts rewritten as a test module's are (so they
# report what they compared and still run under python -O).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest.register_assert_rewrite("impl_helpers")

_db = from_env()
_common = {"database": example_database(_db)} if _db else {}

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
settings.register_profile("dev", max_examples=300, deadline=None, **_common)
settings.register_profile("deep", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], **_common)
if importlib.util.find_spec("hypothesis_crosshair_provider") is not None:
    # Solver-driven paths are slow and vary in length: no deadline, fewer examples.
    settings.register_profile("crosshair", backend="crosshair", max_examples=40, deadline=None,
                              suppress_health_check=list(HealthCheck), **_common)
_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(_profile)

# The readers' fuzz tests (tests/test_trace.py, tests/test_events_check.py) keep a
# per-example deadline, so a pathologically slow parse fails there, under the active
# profile's other settings: ``@settings(settings.get_profile("readers"))``.  A deadline
# is wall clock: in ``ci`` (the default run, on a loaded machine) it is a safety net
# against a hang or an exponential blow-up only, 30 s where the slowest example takes
# about 80 ms with both cores busy; ``dev`` and ``deep`` (run by hand) keep the tight 3 s
# probe.  Where examples are solver-driven (crosshair) an example's time says nothing
# about the reader.
READER_DEADLINE_MS = {"ci": 30_000, "dev": 3000, "deep": 3000, "crosshair": None}
_base = settings.get_profile(_profile)
settings.register_profile(
    "readers", _base,
    deadline=READER_DEADLINE_MS.get(_profile, 3000 if _base.backend == "hypothesis" else None))

"""Hypothesis profiles: ``ci`` (default, quick), ``dev`` and ``deep``.

Pick one with ``HYPOTHESIS_PROFILE=dev pytest``.  ``KVPOOL_EXAMPLE_DB`` names a
directory shared between machines so a failure found on one replays on all.
"""

from __future__ import annotations

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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

"""kvpool: a formally modelled, verified reference implementation of vLLM's block pool.

``kvpool.impl`` is the pool, ``kvpool.model`` its executable specification.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvpool")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

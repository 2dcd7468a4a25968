"""kvpool: a formally modelled, verified reference implementation of vLLM's block pool.

``kvpool.impl`` is the pool, ``kvpool.model`` its executable specification.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Installed, kvpool.model & co. sit inside this package.  In a source checkout
# they are top-level folders beside it (the layout setuptools' package-dir maps
# from), so let imports from the checkout find them there too.
_checkout = Path(__file__).resolve().parent.parent
if not (Path(__file__).parent / "model").is_dir() and (_checkout / "model" / "operations.py").is_file():
    __path__.append(str(_checkout))

try:
    __version__ = version("kvpool")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

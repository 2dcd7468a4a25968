"""kvpool inside vLLM: the ``vllm.general_plugins`` entry point.

``pip install 'kvpool[vllm]'`` registers :func:`register` under the name ``kvpool``.
vLLM calls it in every process it starts when it loads its general plugins (all of
them, or those named in ``VLLM_PLUGINS``).  It puts :class:`kvpool.impl.BlockPool`
in place of ``vllm.v1.core.block_pool.BlockPool`` wherever vLLM bound that name,
re-parents vLLM's own subclasses of the pool onto kvpool's, and makes kvpool emit
vLLM's event classes (``vllm.distributed.kv_events``), which vLLM's KV-cache
manager recognises.  On a vLLM release whose pool API kvpool does not follow it
logs one line and changes nothing.  Details: ``docs/vllm.md``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

SUPPORTED = ("0.31.",)
"""vLLM release prefixes whose ``BlockPool`` API kvpool follows."""

# A child of vLLM's logger, so the line is printed by vLLM's own handler.
logger = logging.getLogger("vllm.plugins.kvpool")

_POOL_MODULE = "vllm.v1.core.block_pool"
_installed: dict[str, Any] = {}
"""While installed: the original class, and what was rebound, for :func:`uninstall`."""


def supported(version: str) -> bool:
    """Whether kvpool follows the pool API of this vLLM version."""
    return version.startswith(SUPPORTED)


def register() -> None:
    """The entry point: install kvpool's pool, or say in one line why not."""
    vllm = importlib.import_module("vllm")
    version = str(getattr(vllm, "__version__", "unknown"))
    if not supported(version):
        logger.warning(
            "kvpool plugin not loaded: vLLM %s's BlockPool API is not the one kvpool follows "
            "(vLLM %s); vLLM's own pool stays in place", version, "x, ".join(SUPPORTED) + "x")
        return
    rebound = install()
    logger.info("kvpool plugin: kvpool.impl.BlockPool replaces vLLM's BlockPool in %d modules",
                len(rebound))


def install() -> list[str]:
    """Put kvpool's pool in place of vLLM's; return the modules and classes changed.

    Idempotent.  Modules imported later get kvpool's pool from
    ``vllm.v1.core.block_pool`` itself, and classes defined later subclass it.
    """
    from kvpool.impl import BlockPool
    from kvpool.impl.events import use_vllm_event_classes

    module = importlib.import_module(_POOL_MODULE)
    if _installed:
        return list(_installed["rebound"])
    original = module.BlockPool
    if original is BlockPool:
        return []
    rebound: list[str] = []
    reparented: list[type] = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, BlockPool)
                rebound.append(f"{name}.{attr}")
            elif (isinstance(value, type) and original in value.__bases__
                  and value.__module__ == name and value not in reparented):
                value.__bases__ = tuple(BlockPool if b is original else b for b in value.__bases__)
                reparented.append(value)
                rebound.append(f"{name}.{attr} (now a subclass of kvpool's pool)")
    events = use_vllm_event_classes()
    _installed.update(original=original, rebound=rebound, reparented=reparented, events=events)
    return rebound


def uninstall() -> None:
    """Undo :func:`install` (for tests): vLLM's pool and kvpool's own event classes again."""
    if not _installed:
        return
    from kvpool.impl import BlockPool
    from kvpool.impl.events import use_event_classes

    original = _installed["original"]
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is BlockPool:
                setattr(mod, attr, original)
    for cls in _installed["reparented"]:
        cls.__bases__ = tuple(original if b is BlockPool else b for b in cls.__bases__)
    use_event_classes(*_installed["events"])
    _installed.clear()


__all__ = ["SUPPORTED", "install", "register", "supported", "uninstall"]

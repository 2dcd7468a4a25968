"""kvpool inside vLLM: the ``vllm.general_plugins`` entry point.

``pip install 'kvpool[vllm]'`` registers :func:`register` under the name ``kvpool``.
vLLM calls it in every process it starts when it loads its general plugins (all of
them, or those named in ``VLLM_PLUGINS``).  It puts :class:`kvpool.impl.BlockPool`
in place of ``vllm.v1.core.block_pool.BlockPool`` wherever vLLM bound that name,
re-parents vLLM's own subclasses of the pool onto kvpool's, and makes kvpool emit
vLLM's event classes (``vllm.distributed.kv_events``), which vLLM's KV-cache
manager recognises.  On a vLLM release whose pool API kvpool does not follow it
logs one line and changes nothing.  Details: ``docs/vllm.md``.

``KVPOOL_PLUGIN`` says what it does: ``replace`` (the default) as above;
``shadow`` keeps vLLM's own pool and shadows every pool vLLM builds with the
model (:mod:`kvpool.oracle.shadow`: a divergence is logged with a trace, the
engine's behaviour never changes); ``replace,shadow`` both, kvpool's pool
shadowed.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

SUPPORTED = ("0.31.",)
"""vLLM release prefixes whose ``BlockPool`` API kvpool follows."""

# A child of vLLM's logger, so the line is printed by vLLM's own handler.
logger = logging.getLogger("vllm.plugins.kvpool")

_POOL_MODULE = "vllm.v1.core.block_pool"
_installed: dict[str, Any] = {}
"""While installed: the original class, and what was rebound, for :func:`uninstall`."""
ENV_MODE = "KVPOOL_PLUGIN"
MODES = ("replace", "shadow")
"""What ``KVPOOL_PLUGIN`` may name, comma-separated (default ``replace``)."""


def modes(value: str | None = None) -> tuple[str, ...]:
    """The plugin's modes from ``KVPOOL_PLUGIN`` (or ``value``); ``ValueError`` on an unknown one."""
    raw = os.environ.get(ENV_MODE, "") if value is None else value
    named = tuple(dict.fromkeys(m.strip() for m in raw.split(",") if m.strip())) or ("replace",)
    unknown = [m for m in named if m not in MODES]
    if unknown:
        raise ValueError(f"{ENV_MODE}={raw!r}: unknown mode(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(MODES)}, comma-separated")
    return named


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
    try:
        chosen = modes()
    except ValueError as exc:
        logger.warning("kvpool plugin not loaded: %s; vLLM's own pool stays in place", exc)
        return
    if "replace" in chosen:
        rebound = install()
        logger.info("kvpool plugin: kvpool.impl.BlockPool replaces vLLM's BlockPool in %d modules",
                    len(rebound))
    if "shadow" in chosen:
        # lazy: runs inside every vLLM process; loads only what the chosen mode needs
        from kvpool.oracle.shadow import shadow_dir

        rebound = install_shadow()
        logger.info("kvpool plugin: every block pool vLLM builds is shadowed by the model (%d modules); "
                    "divergences are logged with a trace in %s", len(rebound), shadow_dir())


def _rebind(original: type, replacement: type) -> tuple[list[str], list[type]]:
    """Put ``replacement`` wherever a loaded vLLM module bound ``original``, and re-parent vLLM's own
    subclasses of ``original`` onto it; the names changed, and the classes re-parented."""
    rebound: list[str] = []
    reparented: list[type] = []
    for mod, name, attr, value in _vllm_names():
        if value is original:
            setattr(mod, attr, replacement)
            rebound.append(f"{name}.{attr}")
        elif (isinstance(value, type) and original in value.__bases__ and value is not replacement
              and value.__module__ == name and value not in reparented):
            _reparent([value], original, replacement)
            reparented.append(value)
            rebound.append(f"{name}.{attr} (now a subclass of {replacement.__qualname__})")
    return rebound, reparented


def _vllm_names() -> Iterator[tuple[Any, str, str, Any]]:
    """Every name a loaded vLLM module binds: the module, its name, the name, the value."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == "vllm" or name.startswith("vllm.")):
            for attr, value in list(vars(mod).items()):
                yield mod, name, attr, value


def _reparent(classes: Iterable[type], old: type, new: type) -> None:
    for cls in classes:
        cls.__bases__ = tuple(new if b is old else b for b in cls.__bases__)


def install() -> list[str]:
    """Put kvpool's pool in place of vLLM's; return the modules and classes changed.

    Idempotent.  Modules imported later get kvpool's pool from
    ``vllm.v1.core.block_pool`` itself, and classes defined later subclass it.
    """
    # lazy: runs inside every vLLM process; loads only what the chosen mode needs
    from kvpool.impl import BlockPool
    from kvpool.impl.events import use_vllm_event_classes

    module = importlib.import_module(_POOL_MODULE)
    if _installed:
        return list(_installed["rebound"])
    original = module.BlockPool
    if original is BlockPool:
        return []
    rebound, reparented = _rebind(original, BlockPool)
    events = use_vllm_event_classes()
    _installed.update(original=original, rebound=rebound, reparented=reparented, events=events)
    return rebound


def install_shadow(options: dict[str, Any] | None = None) -> list[str]:
    """Shadow every pool vLLM builds from now on: the pool class in place (vLLM's, or kvpool's
    after :func:`install`) becomes a subclass whose pools the model shadows (``options``: the
    shadow's, :class:`kvpool.oracle.shadow.Shadow`).

    The KV-cache coordinator builds every pool vLLM 0.31 has through that name
    (the GPU pool, the CPU offload manager's through its own coordinator), and
    hisparse's ``SharedEventQueueBlockPool`` is re-parented onto the shadowed
    class.  Idempotent; :func:`uninstall` undoes it.
    """
    # lazy: runs inside every vLLM process; loads only what the chosen mode needs
    from kvpool.oracle.shadow import shadowed_class

    module = importlib.import_module(_POOL_MODULE)
    if "shadowed" in _installed:
        return list(_installed["shadow_rebound"])
    base = module.BlockPool
    shadowed = shadowed_class(base, **{"log": logging.getLogger("vllm.plugins.kvpool.shadow"),
                                       **(options or {})})
    rebound, reparented = _rebind(base, shadowed)
    _installed.update(shadowed=shadowed, shadowed_base=base, shadow_rebound=rebound,
                      shadow_reparented=reparented)
    return rebound


def use(mode: str, shadow_options: dict[str, Any] | None = None) -> None:
    """Put in place the pool ``mode`` names (``KVPOOL_PLUGIN``'s modes, or ``none`` for vLLM's own
    bare), whatever was in place before: for a process that runs vLLM's scheduler itself (``kvpool
    replay --engine vllm``); ``shadow_options`` go to the shadow."""
    chosen = () if mode == "none" else modes(mode)
    uninstall()
    if "replace" in chosen:
        install()
    if "shadow" in chosen:
        install_shadow(shadow_options)


def uninstall() -> None:
    """Undo :func:`install` and :func:`install_shadow` (for tests): vLLM's pool and kvpool's own
    event classes again."""
    if not _installed:
        return
    if "shadowed" in _installed:
        shadowed, base = _installed.pop("shadowed"), _installed.pop("shadowed_base")
        _installed.pop("shadow_rebound")
        _rebind(shadowed, base)
        _reparent(_installed.pop("shadow_reparented"), shadowed, base)  # any whose module is gone
        if "original" not in _installed:
            return
    # lazy: runs inside every vLLM process; loads only what the chosen mode needs
    from kvpool.impl import BlockPool
    from kvpool.impl.events import use_event_classes

    original = _installed["original"]
    _rebind(BlockPool, original)
    _reparent(_installed["reparented"], BlockPool, original)  # any whose module is gone
    use_event_classes(*_installed["events"])
    _installed.clear()


__all__ = ["ENV_MODE", "MODES", "SUPPORTED", "install", "install_shadow", "modes", "register", "supported",
           "uninstall", "use"]

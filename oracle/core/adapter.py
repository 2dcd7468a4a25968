"""How the oracle reaches a block pool implementation under test.

The oracle drives every implementation through the reference API (vLLM
0.31.0's ``BlockPool``): the same operation names and signatures, and blocks
as objects with ``block_id``, ``ref_cnt`` and ``block_hash``.  The
operations are the model's declarations (:data:`kvpool.model.OPERATIONS`),
not written out again: :func:`missing_api` checks a pool class against them.
:class:`Lockstep` calls them with block ids translated and observes the pool through its public surface,
adding vLLM's internals where the pool has them
(:mod:`kvpool.oracle.core.observe`).

An :class:`Adapter` is the small part that differs between implementations:
how to build a pool, how its refusals pair with the model's, and whether it
refuses misuse at all (vLLM's pool uses ``assert`` or corrupts itself, so
deliberately wrong calls are left out for it).  A pool class with the
reference constructor needs no adapter of its own: ``kvpool conform --impl
mymodule:MyPool`` wraps it in a :class:`ClassAdapter`.  An implementation
with a different surface (another language behind FFI, say) writes one::

    from dataclasses import dataclass
    from kvpool.oracle.core.abstraction import vllm_refusal

    @dataclass
    class MyAdapter:
        name: str = "mypool over FFI"
        supports_misuse: bool = False        # it does not refuse misuse with typed errors

        def construct(self, num_blocks, caching, hash_block_size, events,
                      metrics_collector=None):
            return MyFacade(num_blocks, caching, hash_block_size, events, metrics_collector)

        def errors_match(self, model_error, pool_error):
            return vllm_refusal(model_error, pool_error)   # out of blocks: a ValueError

    def make_adapter():                      # kvpool conform --adapter mymodule:make_adapter
        return MyAdapter()

``construct`` may leave out ``metrics_collector`` (metrics calls are then not
compared).  An adapter may also define ``observe(pool, probes)`` returning an
:class:`~kvpool.oracle.core.observe.Observation`, to observe what the public
surface cannot show.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvpool.model import OPERATIONS, PUBLIC_OPERATIONS, Operation

from .abstraction import any_value_error, same_refusal, vllm_refusal

ErrorMatcher = Callable[[Exception, Exception | None], bool]

REFERENCE_API: frozenset[str] = frozenset({
    "get_new_blocks", "free_blocks", "touch", "unpin_blocks", "evict_blocks", "reset_prefix_cache",
    "cache_full_blocks", "cache_partial_block", "move_block_hashes", "emit_cached_block_events",
    "take_events", "_insert_block_hash", "_maybe_evict_cached_block", "get_cached_block",
    "is_block_writable", "get_num_free_blocks", "get_usage"})
"""vLLM 0.31.0's ``BlockPool``: the API pools were written against.  It does not grow: an
operation declared beyond it is checked where a pool has it and left out where it does not (the
generators call only what a pool has), so a new operation breaks no pool written before it."""


def required_api() -> tuple[str, ...]:
    """The operations every pool must have: the model's public ones of vLLM's API (the others are
    called only where a pool has them: :func:`optional_api`)."""
    return tuple(n for n in PUBLIC_OPERATIONS if n in REFERENCE_API)


def optional_api() -> tuple[str, ...]:
    """The operations a pool may lack: vLLM's private members, and every one declared beyond its API."""
    return tuple(n for n, op in OPERATIONS.items() if op.role != "caller" and n not in required_api())


@runtime_checkable
class ReferencePool(Protocol):
    """A pool with the reference API; blocks are objects with a ``block_id``.

    Its operations (the model's public ones, checked by :func:`missing_api`) take their declared
    arguments in declared order under vLLM's names.  The observation reads ``blocks`` (each with
    ``block_id``, ``ref_cnt``, ``block_hash``) and ``free_block_queue`` (``get_all_free_blocks()``,
    ``num_free_blocks``), and vLLM's internals where present (:class:`~.observe.Observer`).
    """

    blocks: list[Any]
    free_block_queue: Any


class Adapter(Protocol):
    """A block pool implementation under test, as the oracle sees it."""

    @property
    def name(self) -> str:
        """Shown in reports (e.g. ``kvpool.impl:BlockPool``)."""
        ...

    @property
    def supports_misuse(self) -> bool:
        """Whether the pool refuses deliberately wrong calls (with typed errors)."""
        ...

    def construct(self, num_blocks: int, caching: bool, hash_block_size: int,
                  events: bool) -> ReferencePool:
        """A fresh pool; block 0 is the null block (may also take ``metrics_collector``, to tell)."""
        ...

    def errors_match(self, model_error: Exception, pool_error: Exception | None) -> bool:
        """Whether the pool's refusal counts as the model's."""
        ...


@dataclass(frozen=True)
class ClassAdapter:
    """Any class with the reference constructor and API (kvpool's, vLLM's, a subclass)."""

    pool_class: Callable[..., Any]
    name: str
    supports_misuse: bool = True
    matcher: ErrorMatcher = same_refusal
    lacks: frozenset[str] = frozenset()
    """What the pool lacks besides what its class declares (``kvpool_lacks``): ``--lacks``."""

    def construct(self, num_blocks: int, caching: bool, hash_block_size: int,
                  events: bool, metrics_collector: Any = None) -> ReferencePool:
        extra = {} if metrics_collector is None else {"metrics_collector": metrics_collector}
        pool: ReferencePool = self.pool_class(num_blocks, caching, hash_block_size,
                                              enable_kv_cache_events=events, **extra)
        if self.lacks:  # the lockstep reads a pool's lacks off the pool
            own = tuple(getattr(pool, "kvpool_lacks", ()) or ())
            with contextlib.suppress(AttributeError, TypeError):
                pool.kvpool_lacks = (*own, *sorted(self.lacks - set(own)))  # type: ignore[attr-defined]
        return pool

    def errors_match(self, model_error: Exception, pool_error: Exception | None) -> bool:
        return self.matcher(model_error, pool_error)

    def factory(self) -> Callable[..., Any]:
        """A ``pool_factory`` in the shape :class:`Lockstep` and the campaign take."""
        return adapter_factory(self)


def adapter_factory(adapter: Adapter) -> Callable[..., Any]:
    """Turn an adapter into the ``pool_factory(n, caching, hbs, enable_kv_cache_events=)``, taking a
    ``metrics_collector`` too when the adapter's ``construct`` does."""
    if _takes(adapter.construct, "metrics_collector"):
        def with_metrics(num_blocks: int, caching: bool, hash_block_size: int,
                         enable_kv_cache_events: bool = False, metrics_collector: Any = None) -> Any:
            construct: Any = adapter.construct  # the protocol leaves metrics_collector optional
            return construct(num_blocks, caching, hash_block_size, enable_kv_cache_events,
                             metrics_collector=metrics_collector)

        return with_metrics

    def factory(num_blocks: int, caching: bool, hash_block_size: int,
                enable_kv_cache_events: bool = False) -> Any:
        return adapter.construct(num_blocks, caching, hash_block_size, enable_kv_cache_events)

    return factory


def _takes(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def kvpool_adapter(pool_class: type[Any] | None = None) -> ClassAdapter:
    """kvpool.impl's pool (or a subclass): typed errors, strict matching, misuse on."""
    # lazy: kvpool's own pool, only as the default target (the oracle never needs impl)
    from kvpool.impl import BlockPool

    cls = pool_class or BlockPool
    return ClassAdapter(cls, f"{cls.__module__}:{cls.__qualname__}")


def vllm_adapter(strict_messages: bool = True) -> ClassAdapter:
    """vLLM's own ``BlockPool``, imported only when asked for (the import takes seconds): out of
    blocks a ``ValueError`` (with vLLM's message if ``strict_messages``), misuse not refused."""
    module = importlib.import_module("vllm.v1.core.block_pool")
    # Every refused reset logs a warning; thousands of them would bury the report.
    logging.getLogger(module.__name__).setLevel(logging.ERROR)
    # vLLM's env lookups are slow unless cached; the drop-in test does the same
    with contextlib.suppress(ImportError, AttributeError):
        importlib.import_module("vllm.envs").enable_envs_cache()
    return ClassAdapter(module.BlockPool, "vllm.v1.core.block_pool:BlockPool",
                        supports_misuse=False, matcher=vllm_refusal if strict_messages else any_value_error)


def adapter_for_class(pool_class: Any, strict_messages: bool = True) -> ClassAdapter:
    """The right adapter for a pool class: strict for kvpool's, lenient for others.

    Another pool's refusal for lack of blocks is a ``ValueError``: with vLLM's exact message when
    ``strict_messages`` (``kvpool conform --strict-messages``), any message otherwise.
    """
    from kvpool.impl import BlockPool  # lazy, as in kvpool_adapter

    if isinstance(pool_class, type) and issubclass(pool_class, BlockPool):
        return kvpool_adapter(pool_class)
    if getattr(pool_class, "__module__", "").startswith("vllm."):
        return vllm_adapter(strict_messages)
    name = f"{getattr(pool_class, '__module__', '?')}:{getattr(pool_class, '__qualname__', '?')}"
    return ClassAdapter(pool_class, name, supports_misuse=False,
                        matcher=vllm_refusal if strict_messages else any_value_error)


def misuse_setting(adapter: Adapter, requested: bool = True) -> tuple[bool, str]:
    """Whether deliberately wrong calls are made, and a line that says why (for every command)."""
    if not requested:
        return False, "misuse off: asked for (--no-misuse); only legal calls are made"
    if not adapter.supports_misuse:
        return False, (f"misuse off: {adapter.name} does not refuse misuse with the model's refusal "
                       "kinds (vLLM asserts or corrupts itself); only legal calls are made")
    return True, ("misuse on: deliberately wrong calls are made; each must be refused, as the model "
                  "refuses it, and change nothing")


def missing_api(pool_class: Any, lacks: Iterable[str] = ()) -> list[str]:
    """The required operations ``pool_class`` lacks, or the calls of any it has that it cannot take,
    but those declared lacking (``lacks``, and the class's ``kvpool_lacks``).

    A method must take the declared arguments positionally (``touch(block_ids)``), and the required
    ones alone (``cache_full_blocks(...) without block_mask``); their names (vLLM's) are not
    compared, and a signature that cannot be read (a compiled method) is taken as it is.
    """
    out, required = [], required_api()
    declared = {*lacks, *(getattr(pool_class, "kvpool_lacks", ()) or ())}
    for name, op in OPERATIONS.items():
        if op.role == "caller" or op.private or name in declared:
            continue
        method = getattr(pool_class, name, None)
        if not callable(method):
            if name in required:
                out.append(name)
        elif untaken := _untaken_call(method, op):
            out.append(untaken)
    return out


def lacking(pool: Any) -> list[str]:
    """The operations of :func:`optional_api` ``pool`` (a class or an instance) lacks: left unchecked."""
    return [n for n in optional_api() if not callable(getattr(pool, n, None))]


def _untaken_call(method: Callable[..., Any], op: Operation) -> str | None:
    """The call of ``op`` with its declared arguments (or its required ones) ``method`` cannot take."""
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):
        return None
    lead = [] if inspect.ismethod(method) else [None]  # a function on the class takes the pool first
    required = [a.name for a in op.args if not a.optional]
    optional = [a.name for a in op.args if a.optional]
    for names, left_out in (([*required, *optional], ""), (required, f" without {', '.join(optional)}")):
        try:
            sig.bind(*lead, *[None] * len(names))
        except TypeError:
            return f"{op.name}({', '.join(names)}){left_out}"
    return None


class Mispredicted(BaseException):
    """A pool answering ahead of its process found that the process answered a call otherwise: the
    run is to be made again, each call waiting for its answer (a ``BaseException``, so that it
    passes the lockstep's comparison of refusals untouched; ``__cause__``: the process's failure)."""


class LoadError(ValueError):
    """A ``module:name`` that names no usable pool or adapter; the message starts with the spec
    (``'pkg.mod:Pool': cannot import pkg.mod: ...``), for a command line to put its flag in front."""


def load_object(spec: str) -> Any:
    """Import ``module:name`` (a dotted name inside the module); raise :class:`LoadError`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise LoadError(f"{spec!r}: expected MODULE:NAME")
    # A module in the current directory is found, as ``python -m`` would, but after the installed
    # packages: in front, a checkout's kvpool/ folder shadowed the installed kvpool in every process
    # spawned later with this sys.path (the verify phases' workers).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise LoadError(f"{spec!r}: cannot import {module_name}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise LoadError(f"{spec!r}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    return obj


__all__ = ["REFERENCE_API", "Adapter", "ClassAdapter", "ErrorMatcher", "LoadError", "Mispredicted",
           "ReferencePool", "adapter_factory", "adapter_for_class", "kvpool_adapter", "lacking",
           "load_object", "missing_api", "optional_api", "required_api", "vllm_adapter"]

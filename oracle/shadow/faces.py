"""The two ways a shadow is put on a pool: a shadowed subclass of a pool class, or a wrapper of one pool.

:func:`shadowed_class` makes a subclass of a pool class whose every pool
shadows itself from its creation (the vLLM plugin puts one in place of
vLLM's ``BlockPool``, :mod:`kvpool.vllm_plugin`); :class:`ShadowPool` wraps one
fresh pool object.  Either way each operation goes through its
:class:`~.record.Shadow`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kvpool.model import OPERATIONS, POOL_OPERATIONS

from .messages import REPEATABLE
from .record import Shadow
from .settings import ENV_STRICT, flag, logger

_LOOPING = frozenset(op for op, decl in OPERATIONS.items() if decl.role != "query" and decl.args)
"""Operations with arguments, which may call the pool's own operations on every block they handle
(``_maybe_evict_cached_block``, ``_insert_block_hash``): while one runs, the pool's calls to itself
go straight to its methods."""
MODULE = "kvpool.oracle.shadow"
"""Where a shadowed class says it lives (the package users import)."""


def shadow_of(pool: Any) -> Shadow | None:
    """The shadow watching ``pool`` (a pool of a :func:`shadowed_class` or a :class:`ShadowPool`)."""
    found = (object.__getattribute__(pool, "_kvpool_shadow") if isinstance(pool, ShadowPool)
             else getattr(pool, "_kvpool_shadow", None))
    return found if isinstance(found, Shadow) else None


def _method(op: str, real: Callable[..., Any], inside: list[Any]) -> Callable[..., Any]:
    """The shadowed ``op``; ``inside`` ends with the pool whose operation is running, if any (its
    calls to itself are its own business, and the cheapest check: the engine's pools call their
    own methods once per block).  The shadow is an ordinary attribute of the pool: reading the
    pool's ``__dict__`` would make CPython give up its fast attribute reads for that pool, whose
    own code then runs 10-15% slower."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is inside[-1]:
            return real(self, *args, **kwargs)
        shadow = self._kvpool_shadow
        if shadow is None or shadow.depth or not shadow.active:  # unshadowed, or the shadow reading it
            return real(self, *args, **kwargs)
        if not kwargs and ((not args and op in REPEATABLE) or (
                op == "get_cached_block" and len(args) == 2 and type(args[1]) is list)):
            return shadow.query(op, real, self, args)
        if op not in _LOOPING:
            return shadow.call(op, real.__get__(self), args, kwargs)
        inside.append(self)
        try:
            return shadow.call(op, real.__get__(self), args, kwargs)
        finally:
            inside.pop()

    method.__name__ = method.__qualname__ = op
    method.__doc__ = real.__doc__
    return method


def shadowed_class(base: type, **options: Any) -> type:
    """A subclass of the pool class ``base`` whose every pool is shadowed from its creation.

    Only calls from outside the pool are shadowed (a pool calling its own
    operations is its own business); ``options`` go to :class:`~.record.Shadow`.
    """
    namespace: dict[str, Any] = {"__module__": MODULE, "_kvpool_shadow": None,
                                 "__doc__": f"{base.__qualname__}, shadowed by the model."}
    inside: list[Any] = [None]
    for op in POOL_OPERATIONS:
        real = getattr(base, op, None)
        if callable(real):
            namespace[op] = _method(op, real, inside)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)  # type: ignore[misc]
        try:
            object.__setattr__(self, "_kvpool_shadow", Shadow(self, **options))
        except Exception as exc:  # never the engine's failure
            if flag(ENV_STRICT):
                raise
            logger.warning("kvpool shadow: %s not shadowed: %r", type(self).__name__, exc)

    namespace["__init__"] = __init__
    namespace["_kvpool_shadowed_base"] = base
    return type(f"Shadowed{base.__name__}", (base,), namespace)


class ShadowPool:
    """One fresh pool object behind a shadow: the pool's attributes, its operations shadowed."""

    def __init__(self, pool: Any, **options: Any) -> None:
        object.__setattr__(self, "_kvpool_pool", pool)
        object.__setattr__(self, "_kvpool_shadow", Shadow(pool, **options))

    def __getattr__(self, name: str) -> Any:
        pool = object.__getattribute__(self, "_kvpool_pool")
        attr = getattr(pool, name)
        if name in OPERATIONS and callable(attr):
            shadow: Shadow = object.__getattribute__(self, "_kvpool_shadow")
            return lambda *args, **kwargs: shadow.call(name, attr, args, kwargs)
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_kvpool_pool"), name, value)

    @property
    def wrapped(self) -> Any:
        """The pool itself."""
        return object.__getattribute__(self, "_kvpool_pool")


def shadowed(pools: Iterable[Any]) -> Iterator[Shadow]:
    """The shadows of ``pools`` (those that have one)."""
    for pool in pools:
        found = shadow_of(pool)
        if found is not None:
            yield found


__all__ = ["ShadowPool", "shadow_of", "shadowed", "shadowed_class"]

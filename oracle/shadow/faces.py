"""The two ways a shadow is put on a pool: a shadowed subclass of a pool class, or a wrapper of one pool.

:func:`shadowed_class` makes a subclass of a pool class whose every pool
shadows itself from its creation (the vLLM plugin puts one in place of
vLLM's ``BlockPool``, :mod:`kvpool.vllm_plugin`); :class:`ShadowPool` wraps one
fresh pool object.  Either way each operation goes through its
:class:`~.record.Shadow`.
"""

from __future__ import annotations

import inspect
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
_PER_BLOCK = ("_maybe_evict_cached_block", "_insert_block_hash")
"""What vLLM's pool calls on itself once per block inside its operations: their wrappers take the
pool method's own parameters (:func:`_exact`)."""
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
    return _exact(op, real, inside, method) if op in _PER_BLOCK else method


def _exact(op: str, real: Callable[..., Any], inside: list[Any], method: Callable[..., Any]
           ) -> Callable[..., Any]:
    """``method`` behind a function with ``real``'s own parameters: a call of the pool to itself,
    once per block it handles, then costs an identity test and a call (0.1 us), not the packing
    of ``*args`` and ``**kwargs`` on the way in and out (0.2-0.35 us).  ``method`` as it is where
    the parameters cannot be written out (no signature, or ``*args``, ``**kwargs``, ``/``)."""
    try:
        params = list(inspect.signature(real).parameters.values())
    except (TypeError, ValueError):
        return method
    simple = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not params or any(p.kind not in simple or not p.name.isidentifier() or p.name.startswith("_kvpool")
                         for p in params):
        return method
    defaults = {f"_kvpool_default{i}": p.default for i, p in enumerate(params)
                if p.default is not inspect.Parameter.empty}
    heads, passed, starred = [], [], False
    for i, p in enumerate(params):
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            heads.append("*")
            starred = True
        heads.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}=_kvpool_default{i}")
        passed.append(p.name if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}")
    source = (f"def {op}({', '.join(heads)}):\n"
              f"    if {params[0].name} is _kvpool_inside[-1]:\n"
              f"        return _kvpool_real({', '.join(passed)})\n"
              f"    return _kvpool_method({', '.join(passed)})\n")
    namespace = {"_kvpool_inside": inside, "_kvpool_real": real, "_kvpool_method": method, **defaults}
    exec(compile(source, f"<shadowed {op}>", "exec"), namespace)  # every name read from the signature
    made: Callable[..., Any] = namespace[op]
    made.__qualname__ = op
    made.__doc__ = real.__doc__
    made.__annotations__ = dict(getattr(real, "__annotations__", {}))
    return made


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
    return (found for found in map(shadow_of, pools) if found is not None)


__all__ = ["ShadowPool", "shadow_of", "shadowed", "shadowed_class"]

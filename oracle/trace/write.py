"""Writing trace lines: a pool's (or the model's) calls, results and events in the trace's JSON form.

Bytes become lowercase hex, blocks their ids, keys the pool's concrete form
(:mod:`kvpool.oracle.core.abstraction`), so that a trace written here reads the
same as one written by a pool in another language.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvpool.model import OPERATIONS, Event

from ..core import abstraction
from ..core.lockstep import Watcher
from ..core.observe import Observation
from .schema import ARG_KINDS, RESULT_KINDS, Json

_SCALARS = frozenset((int, str, bool, float, type(None)))


def to_json(value: Any) -> Json:
    """Plain JSON form: bytes as lowercase hex, tuples as lists."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def event_to_json(event: Any) -> dict[str, Json]:
    """One event of a pool (any classes named like vLLM's) as a trace/event-stream object:
    :func:`kvpool.oracle.core.abstraction.pool_event`'s fields in their JSON form, in one pass."""
    kind = abstraction.event_type(event)
    if kind is None:
        return {"type": type(event).__name__}
    fields = abstraction.EVENT_FIELDS[kind]
    return {"type": kind, **{name: to_json(getattr(event, name, None)) for name in fields}}


def model_event_to_json(event: Event) -> dict[str, Json]:
    """One event of the model, as a reference pool would write it."""
    return {k: to_json(v) for k, v in abstraction.model_event(event).items()}


def request_to_json(req: Any) -> dict[str, Json]:
    """The request attributes the pool reads, as they are at this call."""
    if getattr(req, "prompt_embeds", None) is not None:
        raise ValueError("requests with prompt_embeds cannot be traced (format version 1)")
    lora = req.lora_request
    return {
        "request_id": str(req.request_id),
        "all_token_ids": list(req.all_token_ids),
        "block_hashes": [bytes(h).hex() for h in req.block_hashes],
        "lora": None if lora is None else {
            "name": lora.lora_name, "id": lora.lora_int_id, "path": lora.lora_path},
        "mm": [{"identifier": f.identifier, "offset": f.mm_position.offset,
                "length": f.mm_position.length} for f in req.mm_features or ()],
        "cache_salt": req.cache_salt,
        "session_id": req.session_id,
    }


def observation_to_json(obs: Observation) -> dict[str, Json]:
    """An :class:`Observation` with keys as the pool's hex bytes and tuples as lists."""
    if obs.ref is None or obs.free is None or obs.primary is None:
        raise ValueError("an observation through calls only (api-only) has no trace form")
    key = abstraction.concrete_key
    out: dict[str, Json] = {
        "ref": to_json(obs.ref), "free": to_json(obs.free),
        "primary": [None if p is None else [key(p[0]).hex(), p[1]] for p in obs.primary]}
    if obs.secondary is not None:
        out["secondary"] = [[key(k).hex() for k in keys] for keys in obs.secondary]
    if obs.index is not None:
        out["index"] = [[key(k).hex(), list(ids)] for k, ids in obs.index]
    if obs.watched is not None:
        out["watched"] = list(obs.watched)
    out["num_free"] = obs.num_free
    return out


def encode_args(op: str, args: Sequence[Any], kwargs: dict[str, Any],
                request: Callable[[Any], Json] | None = None) -> dict[str, Json]:
    """Name each argument after the model's parameter and encode it by its kind (a request by
    ``request``, :func:`request_to_json` unless given)."""
    named = {**dict(zip((a.name for a in OPERATIONS[op].args), args, strict=False)), **kwargs}
    out: dict[str, Json] = {}
    for name, value in named.items():
        kind = ARG_KINDS[op][name]
        if kind == "request":
            out[name] = (request or request_to_json)(value)
        elif kind == "watcher":
            out[name] = value.name if isinstance(value, Watcher) else repr(value)
        elif kind == "ints":
            out[name] = [getattr(b, "block_id", b) for b in value]
        else:
            out[name] = to_json(getattr(value, "block_id", value))
    return out


def encode_result(op: str, result: Any) -> Json:
    """A pool's return value in the trace's form (blocks as ids)."""
    if result is None:
        return None
    kind = RESULT_KINDS.get(op)
    if kind in ("ints", "ints?"):
        return [getattr(b, "block_id", b) for b in result]
    if kind == "events":
        return [event_to_json(e) for e in result]
    return to_json(result)


def encode_model_result(op: str, result: Any) -> Json:
    """The model's return value in the form a reference pool writes it."""
    if result is None:
        return None
    kind = RESULT_KINDS.get(op)
    if kind == "events":
        return [model_event_to_json(e) for e in result]
    if kind == "hash?":  # a key
        return to_json(abstraction.concrete_key(result))
    return to_json(result)


__all__ = ["encode_args", "encode_model_result", "encode_result", "event_to_json", "model_event_to_json",
           "observation_to_json", "request_to_json", "to_json"]

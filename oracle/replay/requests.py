"""Request traces as ``kvpool replay`` reads them: Mooncake's format and a plain one, streamed.

Mooncake's FAST'25 release (kvcache-ai/Mooncake, ``FAST25-release/traces/``)
writes one request per line: ``timestamp`` (arrival, ms), ``input_length``,
``output_length`` and ``hash_ids``, one id per ``hash_block_tokens`` (512)
tokens of the prompt, equal ids for equal content.  The prompt is made of
tokens that only the id decides (:func:`mooncake_prompt`), so that equal
content gives equal tokens, hence equal block hashes, and different ids never
share a token.  The plain format is a request per line with its tokens:
``{"arrival": ms, "prompt": [token ids], "output_length": n}`` and, optionally,
``"lora"`` (an adapter name) and ``"cache_salt"``.

Both are read a line at a time (a trace may be longer than memory); a bad
line is a :class:`ReplayInputError` naming the file, the line and the field.
:func:`synthetic_mooncake` writes a seeded trace in Mooncake's format for tests.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..trace.read import json_lines
from ..trace.schema import TraceError

FORMATS = ("auto", "mooncake", "plain")
HASH_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id (the FAST'25 release's block size)."""
MAX_TOKENS = 1 << 22
"""Longest prompt or output a line may ask for (a typo of a length is caught, not allocated)."""


class ReplayInputError(ValueError):
    """A request trace that cannot be read: ``FILE:LINE: what``."""

    def __init__(self, path: str, line: int, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}" if line else f"{path}: {what}")
        self.path, self.line, self.what = path, line, what


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives, its prompt, how many tokens it generates."""

    index: int
    """Its place in the trace, from 0."""
    arrival_ms: float
    prompt: list[int]
    output_length: int
    lora: str | None = None
    cache_salt: str | None = None


def mooncake_prompt(hash_ids: list[int], input_length: int, hash_block_tokens: int) -> list[int]:
    """The prompt a Mooncake line stands for: block ``i`` is ``hash_block_tokens`` tokens that only
    ``hash_ids[i]`` decides (id ``h``'s ``j``-th token is ``h * hash_block_tokens + j``), cut to
    ``input_length`` tokens."""
    tokens = [t for h in hash_ids for t in range(h * hash_block_tokens, (h + 1) * hash_block_tokens)]
    return tokens[:input_length]


def _int(obj: dict[str, Any], name: str, low: int, high: int = MAX_TOKENS) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {value!r}"[:200])
    return value


def _arrival(obj: dict[str, Any], name: str) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name}: expected a time in ms (a number >= 0), got {value!r}"[:200])
    return float(value)


def _known(obj: dict[str, Any], known: set[str], form: str) -> None:
    extra = sorted(set(obj) - known)
    if extra:
        raise ValueError(f"unknown field {extra[0]!r} ({form} fields: {', '.join(sorted(known))})")


def _mooncake(obj: dict[str, Any], index: int, hash_block_tokens: int) -> TraceRequest:
    _known(obj, {"timestamp", "input_length", "output_length", "hash_ids"}, "Mooncake's")
    length = _int(obj, "input_length", 1)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(type(h) is int and 0 <= h < 1 << 40 for h in ids):
        raise ValueError("hash_ids: expected a list of ids (integers in [0, 2**40))")
    if len(ids) != -(-length // hash_block_tokens):
        raise ValueError(f"hash_ids: {len(ids)} ids for {length} tokens in blocks of {hash_block_tokens} "
                         f"(expected {-(-length // hash_block_tokens)}; is --hash-block-tokens right?)")
    return TraceRequest(index, _arrival(obj, "timestamp"), mooncake_prompt(ids, length, hash_block_tokens),
                        _int(obj, "output_length", 1))


def _plain(obj: dict[str, Any], index: int) -> TraceRequest:
    _known(obj, {"arrival", "prompt", "output_length", "lora", "cache_salt"}, "the plain format's")
    prompt = obj.get("prompt")
    if (not isinstance(prompt, list) or not prompt or len(prompt) > MAX_TOKENS
            or not all(type(t) is int and 0 <= t < 1 << 62 for t in prompt)):
        raise ValueError("prompt: expected a non-empty list of token ids (integers in [0, 2**62))")
    for name in ("lora", "cache_salt"):
        if obj.get(name) is not None and not (isinstance(obj[name], str) and obj[name]):
            raise ValueError(f"{name}: expected a non-empty string or null, got {obj[name]!r}"[:200])
    return TraceRequest(index, _arrival(obj, "arrival"), prompt, _int(obj, "output_length", 1),
                        obj.get("lora"), obj.get("cache_salt"))


def read_requests(path: str | Path, *, form: str = "auto", hash_block_tokens: int = HASH_BLOCK_TOKENS,
                  limit: int | None = None) -> Iterator[TraceRequest]:
    """The trace's requests in order, read as they are needed (``limit``: the first that many).

    ``form`` ``auto`` reads Mooncake's format when the first request has
    ``hash_ids``, else the plain one.  Arrivals may not go back in time.
    """
    if form not in FORMATS:
        raise ValueError(f"format {form!r}: expected one of {', '.join(FORMATS)}")
    if hash_block_tokens < 1:
        raise ValueError("--hash-block-tokens must be positive")
    name, index, last = str(path), 0, 0.0
    lines = json_lines(path)
    while limit is None or index < limit:
        try:
            found = next(lines, None)
        except TraceError as exc:  # unreadable, not UTF-8, not JSON
            raise ReplayInputError(name, exc.line, exc.what) from None
        if found is None:
            return
        number, obj = found
        try:
            if not isinstance(obj, dict):
                raise ValueError(f"expected an object per line, got {type(obj).__name__}")
            if form == "auto":
                form = "mooncake" if "hash_ids" in obj else "plain"
            req = _mooncake(obj, index, hash_block_tokens) if form == "mooncake" else _plain(obj, index)
            if req.arrival_ms < last:
                raise ValueError(f"arrival {req.arrival_ms:g} ms is before the previous line's "
                                 f"{last:g} ms (requests must be in arrival order)")
        except (ValueError, RecursionError) as exc:
            raise ReplayInputError(name, number, str(exc) or type(exc).__name__) from None
        last = req.arrival_ms
        index += 1
        yield req


def synthetic_mooncake(seed: int, requests: int, *, hash_block_tokens: int = HASH_BLOCK_TOKENS,
                       mean_gap_ms: float = 200.0, max_blocks: int = 24,
                       max_output: int = 64) -> Iterator[dict[str, Any]]:
    """A seeded trace in Mooncake's format: shared system prompts, multi-turn conversations whose
    next turn repeats the last one's prompt, one-off prompts; Poisson arrivals."""
    rng, numbers = random.Random(seed), itertools.count()

    def fresh(n: int) -> list[int]:
        return [next(numbers) for _ in range(n)]

    systems = [fresh(rng.randint(1, max(1, max_blocks // 4))) for _ in range(3)]
    talks: deque[list[int]] = deque(maxlen=16)
    clock = 0.0
    for _ in range(requests):
        clock += rng.expovariate(1 / mean_gap_ms)
        roll = rng.random()
        if talks and roll < 0.4:  # a conversation's next turn: its history, then new blocks
            ids = rng.choice(talks) + fresh(rng.randint(1, 3))
        elif roll < 0.8:  # a new conversation under a shared system prompt
            ids = rng.choice(systems) + fresh(rng.randint(1, max(1, max_blocks // 2)))
        else:  # a one-off prompt
            ids = fresh(rng.randint(1, max_blocks))
        ids = ids[:max_blocks]
        if roll < 0.8:
            talks.append(ids)
        tail = rng.randint(1, hash_block_tokens)
        yield {"timestamp": int(clock), "input_length": (len(ids) - 1) * hash_block_tokens + tail,
               "output_length": rng.randint(1, max_output), "hash_ids": ids}


def write_lines(path: str | Path, lines: Iterator[dict[str, Any]]) -> int:
    """Write JSON lines; how many."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            n += 1
    return n


__all__ = ["FORMATS", "HASH_BLOCK_TOKENS", "ReplayInputError", "TraceRequest", "mooncake_prompt",
           "read_requests", "synthetic_mooncake", "write_lines"]

"""What the pool reads of a request, written out plainly.

The pool never hashes: a request arrives with one chained hash per
``hash_block_size`` chunk of its tokens (``block_hashes``), each naming the
whole prefix up to that chunk's end.  The pool reads those hashes at its own
block size, and, for its events and for the ghost state that says what a
block holds, the chunk's extra keys: what besides the tokens decides the KV
(the LoRA adapter, multimodal items, the cache salt, prompt embeddings).

Any object with vLLM's ``Request`` attributes works: ``block_hashes``,
``all_token_ids``, ``lora_request`` (``lora_name``, ``lora_path``,
``adapter_id``, ``name``), ``mm_features`` (``identifier``,
``mm_position.offset``/``length``, sorted by offset), ``cache_salt``,
``session_id`` and, optionally, ``prompt_embeds``.
"""

from __future__ import annotations

import hashlib
import sys
import weakref
from collections.abc import Iterator
from typing import Any

from .events import ExtraKeys, Hash

TaggedKey = tuple[Any, ...]
"""One extra key as it enters a hash: ``("lora", name, path)``, ``("mm", id, offset)``, ..."""
Chunk = tuple[tuple[int, ...], tuple[TaggedKey, ...] | None]
"""One hash chunk of a prefix: its tokens and its extra keys."""


class Prefix:
    """Ghost: a token prefix, chunk by chunk: what a block's KV was computed from.

    A prefix is its last chunk on top of the prefix before it.  Prefixes are
    values, made only by :meth:`then`, which interns them: equal prefixes are
    the same object, so comparing two costs nothing however long they are,
    and two requests sharing a prefix share its chunks.  Each also keeps a
    farther ancestor (``jump``, skew-binary spacing): :meth:`up_to` then
    takes a number of steps logarithmic in the distance, so checking a
    write into a block of a long prompt does not walk the prompt.
    """

    __slots__ = ("__weakref__", "chunk", "depth", "jump", "parent")

    def __init__(self, parent: Prefix | None, chunk: Chunk | None) -> None:
        self.parent, self.chunk = parent, chunk
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.jump: Prefix = self if parent is None else parent
        """An ancestor: the parent's jump's jump when the two spans are equal, else the parent."""
        if parent is not None:
            up = parent.jump
            if parent.depth - up.depth == up.depth - up.jump.depth:
                self.jump = up.jump

    def then(self, chunk: Chunk) -> Prefix:
        """This prefix followed by ``chunk``."""
        key = (id(self), chunk)
        made = _MADE.get(key)
        if made is None:
            made = _MADE[key] = Prefix(self, chunk)
        return made

    def __len__(self) -> int:
        return self.depth

    def up_to(self, depth: int) -> Prefix:
        """The first ``depth`` chunks of this prefix."""
        p = self
        while p.depth > depth:
            p = p.jump if p.jump.depth >= depth else p.parent  # type: ignore[assignment]
        return p

    def __iter__(self) -> Iterator[Chunk]:
        """The chunks, first to last."""
        chain: list[Chunk] = []
        p: Prefix | None = self
        while p is not None and p.chunk is not None:
            chain.append(p.chunk)
            p = p.parent
        return reversed(chain)

    def __repr__(self) -> str:
        return repr(tuple(self))


_MADE: weakref.WeakValueDictionary[tuple[int, Chunk], Prefix] = weakref.WeakValueDictionary()
"""Every live prefix, by (its parent's identity, its last chunk): how equal prefixes are one object."""
Content = Prefix
EMPTY = Prefix(None, None)
"""The empty prefix: what a block handed out holds."""


def extends(longer: Content, shorter: Content) -> bool:
    """Whether ``longer`` holds ``shorter`` as a prefix."""
    return longer.depth >= shorter.depth and longer.up_to(shorter.depth) is shorter


def compatible(held: Content, written: Content) -> bool:
    """Whether one prefix extends the other (a write that keeps what the block held)."""
    return extends(held, written) or extends(written, held)


def hashes_at(request: Any, hash_block_size: int, block_size: int) -> list[Hash]:
    """The request's hash of each whole ``block_size`` block (:func:`block_hash`)."""
    return [block_hash(request, hash_block_size, block_size, i)
            for i in range(num_blocks_hashed(request, hash_block_size, block_size))]


def block_hash(request: Any, hash_block_size: int, block_size: int, i: int) -> Hash:
    """The request's hash of its ``i``-th whole ``block_size`` block (the last chunk's inside it)."""
    found: Hash = request.block_hashes[(i + 1) * (block_size // hash_block_size) - 1]
    return found


def num_blocks_hashed(request: Any, hash_block_size: int, block_size: int) -> int:
    """How many whole ``block_size`` blocks the request's hashes cover."""
    return len(request.block_hashes) // (block_size // hash_block_size)


def prefix_key(request: Any, num_tokens: int, hash_block_size: int, group: int) -> tuple[Hash, int]:
    """The index key naming ``request``'s first ``num_tokens`` tokens in KV-cache ``group``."""
    return request.block_hashes[num_tokens // hash_block_size - 1], group


def chunk_keys(request: Any, start: int, end: int) -> tuple[TaggedKey, ...] | None:
    """The extra keys of tokens ``[start, end)``; ``None`` when there are none.

    In vLLM's order: the LoRA adapter, each multimodal item overlapping the
    chunk (with its offset from the chunk's start), the cache salt (first
    chunk only), the digest of the chunk's prompt embeddings.
    """
    keys: list[TaggedKey] = []
    lora = request.lora_request
    if lora:
        keys.append(("lora", lora.lora_name, lora.lora_path))
    for item in request.mm_features or ():
        offset, length = item.mm_position.offset, item.mm_position.length
        if offset < end and start < offset + length:
            keys.append(("mm", item.identifier, offset - start))
    if start == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        keys.append(("prompt_embeds", hashlib.sha256(_raw_bytes(embeds[start:end])).digest()))
    return tuple(keys) or None


def untagged(keys: tuple[TaggedKey, ...] | None) -> ExtraKeys | None:
    """A chunk's keys as events publish them: names, ``(id, offset)`` pairs, digests."""
    return None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)


def content(request: Any, num_tokens: int, hash_block_size: int) -> Content:
    """Ghost: the request's prefix of ``num_tokens`` tokens (whole chunks).

    A request's earlier tokens never change (its block hashes would then
    name two prefixes), so the chunks read once are kept with the request:
    a call reads only the chunks no call read before.
    """
    made = _chain(request, hash_block_size)
    want = num_tokens // hash_block_size
    tokens = request.all_token_ids
    while len(made) <= want:
        start = (len(made) - 1) * hash_block_size
        end = start + hash_block_size
        made.append(made[-1].then((tuple(tokens[start:end]), chunk_keys(request, start, end))))
    return made[want]


def _chain(request: Any, hash_block_size: int) -> list[Content]:
    """The prefixes of ``request`` read so far: kept per live request where it can be referred to
    weakly, else for the last request read (a request that cannot be, such as one made per trace
    line, is read by one call)."""
    kept = _chains.get(id(request))
    if kept is not None and kept[0]() is request and kept[1] == hash_block_size:
        return kept[2]
    if _last[0] is request and _last[1] == hash_block_size:
        return _last[2]  # type: ignore[no-any-return]
    key, chain = id(request), [EMPTY]
    try:
        _chains[key] = (weakref.ref(request, lambda _r: _chains.pop(key, None)), hash_block_size, chain)
    except TypeError:
        _last[:] = [request, hash_block_size, chain]
    return chain


_chains: dict[int, tuple[Any, int, list[Content]]] = {}
"""Per live request (by id, checked by a weak reference): its prefixes read so far."""
_last: list[Any] = [None, 0, []]
"""The last request that cannot be referred to weakly, and its prefixes read so far."""


def lora_of(request: Any) -> tuple[int | None, str | None]:
    """The adapter id and name events carry, or ``(None, None)``."""
    lora = request.lora_request
    return (lora.adapter_id, lora.name) if lora else (None, None)


def _raw_bytes(embeds: Any) -> bytes:
    """The bytes of an embedding slice: a buffer, or a tensor viewed as bytes."""
    torch = sys.modules.get("torch")  # a tensor exists only once its library is loaded
    if torch is not None and hasattr(embeds, "flatten") and hasattr(embeds, "numpy"):
        return bytes(embeds.flatten().contiguous().view(torch.uint8).numpy())
    return bytes(memoryview(embeds))

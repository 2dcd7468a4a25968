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
from typing import Any

from .events import ExtraKeys, Hash

TaggedKey = tuple[Any, ...]
"""One extra key as it enters a hash: ``("lora", name, path)``, ``("mm", id, offset)``, ..."""
Chunk = tuple[tuple[int, ...], tuple[TaggedKey, ...] | None]
"""One hash chunk of a prefix: its tokens and its extra keys."""
Content = tuple[Chunk, ...]
"""A token prefix, chunk by chunk (ghost: what a block's KV was computed from)."""


def hashes_at(request: Any, hash_block_size: int, block_size: int) -> list[Hash]:
    """The request's hash of each whole ``block_size`` block.

    Hashes chain over the whole prefix, so the hash of a block is the hash
    of the last ``hash_block_size`` chunk inside it.
    """
    per_block = block_size // hash_block_size
    fine = request.block_hashes
    return [fine[(i + 1) * per_block - 1] for i in range(len(fine) // per_block)]


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
    if keys is None:
        return None
    return tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)


def content(request: Any, num_tokens: int, hash_block_size: int) -> Content:
    """Ghost: the prefix of ``num_tokens`` tokens, chunk by chunk."""
    tokens = request.all_token_ids
    return tuple(
        (tuple(tokens[start:start + hash_block_size]),
         chunk_keys(request, start, start + hash_block_size))
        for start in range(0, num_tokens, hash_block_size))


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

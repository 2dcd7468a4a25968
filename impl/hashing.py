"""Chained block hashing and the extra keys that enter it.

Each chunk of ``hash_block_size`` tokens is hashed together with its parent's
hash and its extra keys (LoRA, multimodal items, the cache salt on the first
chunk, prompt embeddings), so a hash names a whole prefix.  The digest is
SHA-256 over an injective, type-tagged encoding: stable across processes
(no ``hash()``), and inputs that differ in parent, tokens or extra keys encode
differently.
"""

from __future__ import annotations

import hashlib
import importlib
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, overload

from .keys import BlockHash

NONE_HASH: BlockHash = hashlib.sha256(b"kvpool-none-hash").digest()


class _Position(Protocol):
    offset: int
    length: int


class _Feature(Protocol):
    identifier: str
    mm_position: _Position


def _encode(obj: Any, out: bytearray) -> None:
    """Append an injective, type-tagged encoding of ``obj`` to ``out``."""
    if obj is None:
        out += b"N"
    elif isinstance(obj, bool):
        out += b"T" if obj else b"F"
    elif isinstance(obj, int):
        raw = obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
        out += b"I" + struct.pack(">I", len(raw)) + raw
    elif isinstance(obj, str):
        raw = obj.encode("utf-8", "surrogatepass")
        out += b"S" + struct.pack(">Q", len(raw)) + raw
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        raw = bytes(obj)
        out += b"B" + struct.pack(">Q", len(raw)) + raw
    elif isinstance(obj, (tuple, list)):
        out += b"L" + struct.pack(">Q", len(obj))
        for item in obj:
            _encode(item, out)
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__} in a block key")


def _encode_tokens(tokens: Sequence[int], out: bytearray) -> None:
    try:
        packed = array("q", tokens).tobytes()
    except (OverflowError, TypeError):
        _encode(tuple(tokens), out)
        return
    out += b"Q" + struct.pack(">Q", len(tokens)) + packed


def hash_block_tokens(
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """The hash of one chunk given its parent's hash (``None`` for the first)."""
    buf = bytearray()
    _encode(parent_block_hash if parent_block_hash else NONE_HASH, buf)
    _encode_tokens(curr_block_token_ids, buf)
    _encode(extra_keys, buf)
    return hashlib.sha256(buf).digest()


def get_mm_features_in_window(
    mm_features: Sequence[_Feature], start: int, end: int
) -> tuple[int, int]:
    """Index range ``[lo, hi)`` of the (offset-sorted) items overlapping ``[start, end)``."""
    lo = 0
    while lo < len(mm_features):
        pos = mm_features[lo].mm_position
        if pos.offset + pos.length > start:
            break
        lo += 1
    hi = lo
    while hi < len(mm_features) and mm_features[hi].mm_position.offset < end:
        hi += 1
    return lo, hi


def _mm_extra_keys(
    request: Any, start: int, end: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    keys: list[Any] = []
    features = request.mm_features
    if not features:
        return keys, start_mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start:
        return keys, start_mm_idx
    idx = start_mm_idx if start_mm_idx >= 0 else len(features) + start_mm_idx
    while idx < len(features):
        feature = features[idx]
        offset = feature.mm_position.offset
        length = feature.mm_position.length
        if end <= offset:
            break
        if start >= offset + length:
            idx += 1
            continue
        keys.append(("mm", feature.identifier, offset - start))
        if end >= offset + length:
            idx += 1
        else:
            break
    return keys, idx


def _tensor_bytes(tensor: Any) -> bytes:
    if hasattr(tensor, "contiguous") and hasattr(tensor, "view"):
        torch = importlib.import_module("torch")  # only reached when the caller uses torch
        return bytes(tensor.flatten().contiguous().view(torch.uint8).numpy())
    return bytes(memoryview(tensor))


def _prompt_embeds_extra_keys(request: Any, start: int, end: int) -> list[tuple[str, bytes]]:
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is None:
        return []
    cache: dict[tuple[int, int], bytes] = request._prompt_embeds_per_block_hashes
    digest = cache.get((start, end))
    if digest is None:
        digest = hashlib.sha256(_tensor_bytes(embeds[start:end])).digest()
        cache[(start, end)] = digest
    return [("prompt_embeds", digest)]


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the chunk ``[start, end)`` and the next multimodal index."""
    mm_keys, next_mm_idx = _mm_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    lora = request.lora_request
    lora_keys = [("lora", lora.lora_name, lora.lora_path)] if lora else []
    salt = request.cache_salt
    salt_keys = [("cache_salt", salt)] if start_token_idx == 0 and salt else []
    embeds_keys = _prompt_embeds_extra_keys(request, start_token_idx, end_token_idx)
    keys = lora_keys + mm_keys + salt_keys + embeds_keys
    return (tuple(keys) if keys else None), next_mm_idx


def to_event_extra_keys(
    extra_keys: Iterable[tuple[Any, ...] | None] | None,
) -> list[tuple[Any, ...] | None] | None:
    """Per-block extra keys in the untagged shape KV-event consumers parse."""
    if not extra_keys:
        return None
    # A list, walked natively when compiled; the result made at its size and filled in place.
    given: list[Any] = extra_keys if type(extra_keys) is list else list(extra_keys)
    if not given:
        return None
    out: list[tuple[Any, ...] | None] = [None] * len(given)
    last: tuple[Any, ...] | None = None
    untagged: tuple[Any, ...] | None = None
    for i, keys in enumerate(given):
        if keys is None:
            continue
        if keys is not last:  # blocks of one request often share one tuple of keys: convert it once
            parts: list[Any] = []
            for k in keys:
                parts.append(k[1:] if k[0] == "mm" else k[1])
            last, untagged = keys, tuple(parts)
        out[i] = untagged
    return out


def get_request_block_hasher(
    hash_block_size: int,
    hash_fn: Callable[[BlockHash | None, Sequence[int], tuple[Any, ...] | None], BlockHash]
    | None = None,
) -> Callable[[Any], list[BlockHash]]:
    """A function returning the hashes of a request's chunks not hashed yet."""
    if hash_block_size <= 0:
        raise ValueError("hash_block_size must be positive")
    chunk_hash = hash_fn or hash_block_tokens

    def hasher(request: Any) -> list[BlockHash]:
        start = len(request.block_hashes) * hash_block_size
        tokens = request.all_token_ids
        if start + hash_block_size > len(tokens):
            return []
        mm_idx = 0
        features = request.mm_features
        if start > 0 and features:
            last = features[-1].mm_position
            if last.offset + last.length > start:
                mm_idx, _ = get_mm_features_in_window(features, start, start + hash_block_size)
        parent = request.block_hashes[-1] if request.block_hashes else None
        new: list[BlockHash] = []
        while start + hash_block_size <= len(tokens):
            end = start + hash_block_size
            extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            parent = chunk_hash(parent, tokens[start:end], extra)
            new.append(parent)
            start = end
        return new

    return hasher


class BlockHashListWithBlockSize(Sequence[BlockHash]):
    """A read-only view of ``hash_block_size`` hashes at a coarser block size.

    Hashes chain over the whole prefix, so the last fine hash inside a coarse
    block already names that block's prefix and is used as its hash.
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(self, block_hashes: Sequence[BlockHash], hash_block_size: int, target: int):
        if hash_block_size <= 0 or target % hash_block_size != 0:
            raise ValueError("target block size must be a positive multiple of hash_block_size")
        self.block_hashes = block_hashes
        self.scale_factor = target // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> BlockHash: ...

    @overload
    def __getitem__(self, idx: slice) -> list[BlockHash]: ...

    def __getitem__(self, idx: int | slice) -> BlockHash | list[BlockHash]:
        if isinstance(idx, slice):
            return [self._at(i) for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(idx)
        return self._at(idx)

    def __iter__(self) -> Iterator[BlockHash]:
        return (self._at(i) for i in range(len(self)))

    def _at(self, idx: int) -> BlockHash:
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]


def resolve_block_hashes(
    block_hashes: Sequence[BlockHash], hash_block_size: int, block_size: int
) -> Sequence[BlockHash]:
    """The request's hashes seen at ``block_size`` granularity."""
    if block_size == hash_block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)

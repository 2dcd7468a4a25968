"""Block hashing: chained, stable across processes, and injective on its inputs; the block-key
encoding as documented, multimodal windows and scans, the extra keys of a chunk, prompt
embeddings, the coarse hash view and the environment flags of ``kvpool.impl.keys``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import subprocess
import sys
import types
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from impl_helpers import FakeTensor, FakeTorch

from kvpool.impl import COMPILED, BlockPool
from kvpool.impl import events as ev
from kvpool.impl import keys as keys_module
from kvpool.impl.hashing import (
    NONE_HASH,
    BlockHashListWithBlockSize,
    generate_block_hash_extra_keys,
    get_mm_features_in_window,
    get_request_block_hasher,
    hash_block_tokens,
    resolve_block_hashes,
    to_event_extra_keys,
)
from kvpool.impl.keys import (
    USE_INT_BLOCK_HASHES,
    _env_flag,
    get_block_hash,
    get_group_id,
    key_event_hash,
    low_64_at,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request

tokens = st.lists(st.integers(min_value=0, max_value=2**40), max_size=8)
atoms = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.binary(max_size=4))
extra = st.one_of(st.none(), st.tuples(st.tuples(st.text(max_size=3), atoms)))
parents = st.one_of(st.none(), st.binary(min_size=32, max_size=32))


@given(parents, tokens, extra, parents, tokens, extra)
def test_different_inputs_give_different_hashes(p1, t1, e1, p2, t2, e2) -> None:  # type: ignore[no-untyped-def]
    same_input = (p1 or NONE_HASH, tuple(t1), e1) == (p2 or NONE_HASH, tuple(t2), e2)
    assert (hash_block_tokens(p1, t1, e1) == hash_block_tokens(p2, t2, e2)) == same_input


def test_hash_is_stable_across_processes() -> None:
    code = (
        "from kvpool.impl.hashing import hash_block_tokens as h;"
        "print(h(None, [1, 2, 3], (('lora', 'a', '/p'), ('cache_salt', 's'))).hex())"
    )
    outs = {
        subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("0", "1", "random")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == hash_block_tokens(
        None, [1, 2, 3], (("lora", "a", "/p"), ("cache_salt", "s"))).hex()


def test_hashes_chain_over_the_whole_prefix() -> None:
    hasher = get_request_block_hasher(2)
    a = Request("a", [1, 2, 3, 4], block_hasher=hasher)
    b = Request("b", [9, 2, 3, 4], block_hasher=hasher)
    assert len(a.block_hashes) == 2
    assert a.block_hashes[0] != b.block_hashes[0]
    assert a.block_hashes[1] != b.block_hashes[1]  # same chunk, different parent
    assert a.block_hashes[1] == hash_block_tokens(a.block_hashes[0], [3, 4])


def test_appending_tokens_hashes_only_completed_chunks() -> None:
    req = Request("a", [1, 2, 3], block_hasher=get_request_block_hasher(2))
    first = list(req.block_hashes)
    req.append_output_token_ids(4)
    assert req.block_hashes[:1] == first and len(req.block_hashes) == 2
    req.append_output_token_ids([5])
    assert len(req.block_hashes) == 2


def test_extra_keys_lora_mm_and_salt_on_first_chunk_only() -> None:
    req = Request(
        "a", list(range(8)), lora_request=LoRARequest("ad", 3, "/w"), cache_salt="salt",
        mm_features=[MultiModalFeature("img", PlaceholderRange(offset=3, length=3))],
    )
    first, idx = generate_block_hash_extra_keys(req, 0, 4, 0)
    assert first == (("lora", "ad", "/w"), ("mm", "img", 3), ("cache_salt", "salt"))
    second, _ = generate_block_hash_extra_keys(req, 4, 8, idx)
    assert second == (("lora", "ad", "/w"), ("mm", "img", -1))
    assert to_event_extra_keys([first, second, None]) == [
        ("ad", ("img", 3), "salt"), ("ad", ("img", -1)), None]
    assert to_event_extra_keys([]) is None


def test_extra_keys_change_the_hash() -> None:
    hasher = get_request_block_hasher(4)
    plain = Request("a", list(range(4)), block_hasher=hasher)
    salted = Request("b", list(range(4)), cache_salt="x", block_hasher=hasher)
    lora = Request("c", list(range(4)), lora_request=LoRARequest("l", 1), block_hasher=hasher)
    assert len({plain.block_hashes[0], salted.block_hashes[0], lora.block_hashes[0]}) == 3


def test_coarser_block_size_uses_the_last_fine_hash() -> None:
    fine = [b"A", b"B", b"C", b"D", b"E"]
    view = resolve_block_hashes(fine, 16, 32)
    assert isinstance(view, BlockHashListWithBlockSize)
    assert list(view) == [b"B", b"D"] and len(view) == 2
    assert view[1] == b"D" and view[-1] == b"D" and view[0:2] == [b"B", b"D"]
    assert resolve_block_hashes(fine, 16, 16) is fine


@given(st.binary(min_size=1, max_size=40), st.integers(min_value=0, max_value=2**32 - 1))
def test_keys_pack_and_unpack(block_hash: bytes, group: int) -> None:
    key = make_block_hash_with_group_id(block_hash, group)
    assert get_block_hash(key) == block_hash and get_group_id(key) == group


@given(st.binary(max_size=44))
def test_group_id_and_event_hash_are_the_key_bytes_big_endian(raw: bytes) -> None:
    """Both are read without ``int.from_bytes`` on the hot path: the same numbers, any length."""
    assert get_group_id(raw) == int.from_bytes(raw[-4:], "big")
    want = int.from_bytes(raw[-8:], "big") if USE_INT_BLOCK_HASHES else raw
    assert maybe_convert_block_hash(raw) == want
    assert key_event_hash(raw) == maybe_convert_block_hash(get_block_hash(raw))


_EDGES = [bytes(8), b"\xff" * 8, b"\x80" + bytes(7), b"\x7f" + b"\xff" * 7,
          bytes(4) + b"\x80" + bytes(3), bytes(4) + b"\x7f\xff\xff\xff", b"\xff" * 4 + bytes(4),
          # eight different bytes, below and above the sign bit: a byte read from the wrong place shows
          bytes(range(1, 9)), bytes(range(0x81, 0x89))]


@pytest.mark.parametrize("low", _EDGES)
@given(st.binary(max_size=36), st.binary(max_size=4))
def test_low_64_bits_read_byte_by_byte_are_int_from_bytes(low: bytes, before: bytes, after: bytes) -> None:
    """What the compiled build publishes (``low_64_at``, machine integers, the top bit added on
    as a Python int) against ``int.from_bytes``, on either side of each 32-bit and the 64-bit
    sign boundary; in either build (interpreted, ``low_64_at`` is only slower)."""
    data = before + low + after
    end = len(before) + 8
    assert low_64_at(data, end) == int.from_bytes(low, "big") == int.from_bytes(data[end - 8:end], "big")
    assert type(low_64_at(data, end)) is int


@pytest.mark.skipif(COMPILED, reason="compiled, the flags are constants the module was built with")
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("use_int", [False, True])
@given(st.binary(min_size=4, max_size=44))
def test_event_hashes_are_the_same_by_either_build_s_path(use_int: bool, native: bool, key: bytes) -> None:
    """The interpreted build runs the compiled build's byte-by-byte path too, with the flags set
    by hand: either path, either setting of the int-hash flag, gives vLLM's event hash."""
    block_hash = key[:-4]
    want = int.from_bytes(block_hash[-8:], "big") if use_int else block_hash
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keys_module, "_NATIVE", native)
        mp.setattr(keys_module, "USE_INT_BLOCK_HASHES", use_int)
        assert key_event_hash(key) == maybe_convert_block_hash(block_hash) == want
        assert type(key_event_hash(key)) is type(want)


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(("raw", "expected"), [
    ("0", False), ("false", False), (" FALSE ", False), ("No", False), ("off", False), ("", False),
    (" ", False), ("1", True), ("true", True), ("yes", True), ("on", True), ("anything", True),
])
def test_env_flag_parses_like_vllm(raw: str, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOL_TEST_FLAG", raw)
    assert _env_flag("KVPOOL_TEST_FLAG", not expected) is expected


@pytest.mark.parametrize("default", [True, False])
def test_env_flag_unset_gives_the_default(default: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_TEST_FLAG", raising=False)
    assert _env_flag("KVPOOL_TEST_FLAG", default) is default


def test_keys_pack_the_group_as_four_big_endian_bytes() -> None:
    block_hash = bytes(range(32))
    packed = make_block_hash_with_group_id(block_hash, 2**32 - 1)
    assert packed == block_hash + b"\xff\xff\xff\xff"
    assert get_block_hash(packed) == block_hash
    assert get_group_id(packed) == 2**32 - 1
    assert get_group_id(make_block_hash_with_group_id(block_hash, 258)) == 258


# ------------------------------------------------------------ multimodal windows


def _features(spans: list[tuple[int, int]]) -> list[MultiModalFeature]:
    return [MultiModalFeature(f"item{i}", PlaceholderRange(offset=o, length=n))
            for i, (o, n) in enumerate(spans)]


# Offset-sorted, non-overlapping layouts of items with positive length over 12 tokens.
_LAYOUTS = [
    [], [(0, 1)], [(0, 12)], [(3, 3)], [(2, 2), (4, 4)], [(1, 2), (5, 1), (8, 3)],
    [(0, 4), (4, 4), (8, 4)], [(2, 6)], [(6, 2), (9, 3)], [(11, 1)], [(0, 2), (7, 5)],
]


@pytest.mark.parametrize("spans", _LAYOUTS)
def test_mm_window_is_the_range_of_overlapping_items(spans: list[tuple[int, int]]) -> None:
    feats: Any = _features(spans)  # frozen dataclasses satisfy the read-only protocol
    for start, end in itertools.combinations(range(14), 2):
        overlapping = [i for i, (o, n) in enumerate(spans) if o < end and o + n > start]
        if overlapping:
            want = (overlapping[0], overlapping[-1] + 1)
        else:  # empty range: both ends at the first item after the window's start
            lo = next((i for i, (o, n) in enumerate(spans) if o + n > start), len(spans))
            want = (lo, lo)
        assert get_mm_features_in_window(feats, start, end) == want, (start, end)


def _mm_request(spans: list[tuple[int, int]], hbs: int) -> Request:
    return Request("mm", list(range(12)), mm_features=_features(spans),
                   block_hasher=get_request_block_hasher(hbs))


@pytest.mark.parametrize("hbs", [1, 2, 3, 4])
@pytest.mark.parametrize("spans", _LAYOUTS)
def test_chunk_extra_keys_are_the_keys_the_hasher_used(spans: list[tuple[int, int]], hbs: int) -> None:
    """A partial-block event's extra keys (``extra_keys_of_chunk``) are the chunk's own keys:
    scanned from the first item, and they reproduce the request's block hash."""
    req = _mm_request(spans, hbs)
    parent: bytes | None = None
    for k, block_hash in enumerate(req.block_hashes):
        start, end = k * hbs, (k + 1) * hbs
        keys = ev.extra_keys_of_chunk(req, start, end)
        assert keys == generate_block_hash_extra_keys(req, start, end, 0)[0]
        mm = [(f"item{i}", o - start) for i, (o, n) in enumerate(spans) if o < end and o + n > start]
        assert keys == (tuple(("mm", ident, off) for ident, off in mm) or None)
        assert hash_block_tokens(parent, req.all_token_ids[start:end], keys) == block_hash
        parent = block_hash


def _reference_mm_scan(spans: list[tuple[int, int]], start: int, end: int, idx: int) -> tuple[Any, int]:
    """vLLM's multimodal scan: from item ``idx`` (negative counts from the end), the items
    overlapping ``[start, end)`` and the index to resume from (the first item not ending
    inside the chunk); ``idx`` unchanged when no item ends after ``start``."""
    if not spans or spans[-1][0] + spans[-1][1] <= start:
        return None, idx
    first = idx if idx >= 0 else len(spans) + idx
    keys = tuple(("mm", f"item{i}", o - start) for i, (o, n) in enumerate(spans)
                 if i >= first and o < end and o + n > start)
    nxt = next((i for i in range(first, len(spans)) if spans[i][0] + spans[i][1] > end), len(spans))
    if nxt < len(spans) and spans[nxt][0] >= end:  # the scan stops at the first item past the chunk
        keys = tuple(k for k in keys if int(k[1][4:]) < nxt)
    return keys or None, nxt


@pytest.mark.parametrize("spans", _LAYOUTS)
def test_mm_scan_from_any_start_index(spans: list[tuple[int, int]]) -> None:
    req = Request("mm", list(range(12)), mm_features=_features(spans))
    for start, end in itertools.combinations(range(0, 13, 2), 2):
        for idx in range(-len(spans), len(spans) + 1):
            got = generate_block_hash_extra_keys(req, start, end, idx)
            assert got == _reference_mm_scan(spans, start, end, idx), (start, end, idx)


@pytest.mark.parametrize("spans", _LAYOUTS)
def test_hasher_resumes_with_the_right_items(spans: list[tuple[int, int]]) -> None:
    """Hashing a request token by token gives the hashes of hashing it at once."""
    whole = _mm_request(spans, 2)
    grown = Request("mm", [0], mm_features=_features(spans), block_hasher=get_request_block_hasher(2))
    for t in range(1, 12):
        grown.append_output_token_ids(t)
    assert grown.block_hashes == whole.block_hashes and len(whole.block_hashes) == 6


# ------------------------------------------------------------- hash encoding


def _spec_encode(obj: Any) -> bytes:
    """The block-key encoding as documented in kvpool.impl.hashing, written out again:
    a one-letter type tag, a big-endian length, then the payload."""
    if obj is None:
        return b"N"
    if isinstance(obj, bool):
        return b"T" if obj else b"F"
    if isinstance(obj, int):
        raw = obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
        return b"I" + struct.pack(">I", len(raw)) + raw
    if isinstance(obj, str):
        raw = obj.encode("utf-8", "surrogatepass")
        return b"S" + struct.pack(">Q", len(raw)) + raw
    if isinstance(obj, bytes):
        return b"B" + struct.pack(">Q", len(obj)) + obj
    assert isinstance(obj, (tuple, list))
    return b"L" + struct.pack(">Q", len(obj)) + b"".join(_spec_encode(x) for x in obj)


def _spec_hash(parent: bytes | None, tokens: list[int], extra: Any) -> bytes:
    if all(-(2**63) <= t < 2**63 for t in tokens):
        packed = b"Q" + struct.pack(">Q", len(tokens)) + array("q", tokens).tobytes()
    else:
        packed = _spec_encode(tuple(tokens))
    return hashlib.sha256(_spec_encode(parent or NONE_HASH) + packed + _spec_encode(extra)).digest()


@pytest.mark.parametrize("extra", [
    None, (None,), (True,), (False,), (True, False, None), (0,), (-1,), (255,), (-(2**70), 2**70),
    ("", "s", "\udc80"), (b"", b"xy"), ((), [1, [2, None]]), (("lora", "a", "/p"), ("mm", "i", -3)),
])
@pytest.mark.parametrize("tokens", [[], [1, 2], [-5, 2**63 - 1], [2**63, 1]])
def test_block_hash_is_sha256_of_the_documented_encoding(extra: Any, tokens: list[int]) -> None:
    for parent in (None, b"", b"parent"):
        assert hash_block_tokens(parent, tokens, extra) == _spec_hash(parent, tokens, extra)


# --------------------------------------------------------------- prompt embeds


def _embeds_keys(embeds: Any, start: int, end: int) -> tuple[Any, ...] | None:
    req = Request("e", list(range(8)), prompt_embeds=embeds)
    return generate_block_hash_extra_keys(req, start, end, 0)[0]


def test_prompt_embeds_key_is_the_digest_of_the_chunk_bytes() -> None:
    embeds = bytes(range(8))  # a buffer: one byte per token
    assert _embeds_keys(embeds, 2, 6) == (("prompt_embeds", hashlib.sha256(embeds[2:6]).digest()),)


def test_prompt_embeds_of_a_tensor_hash_its_raw_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", FakeTorch("torch"))
    rows = [bytes([i, i + 100]) for i in range(8)]
    got = _embeds_keys(FakeTensor(rows), 2, 6)
    assert got == (("prompt_embeds", hashlib.sha256(b"".join(rows[2:6])).digest()),)


class _BytesWithView(bytes):
    """A buffer with a ``view`` method but no ``contiguous``: not a torch tensor."""

    def view(self, *args: Any) -> Any:
        raise AssertionError("a buffer is hashed through memoryview, not as a tensor")


class _Rows:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def __getitem__(self, idx: slice) -> _BytesWithView:
        return _BytesWithView(self.data[idx])


def test_only_tensors_take_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would fail
    data = bytes(range(10, 18))
    assert _embeds_keys(_Rows(data), 4, 8) == (("prompt_embeds", hashlib.sha256(data[4:8]).digest()),)


def test_request_needs_only_the_documented_attributes() -> None:
    """Any object with vLLM's Request attributes works (README): no ``prompt_embeds`` needed."""
    full = Request("q", list(range(8)), block_hasher=get_request_block_hasher(2))
    bare: Any = types.SimpleNamespace(
        block_hashes=list(full.block_hashes), all_token_ids=list(full.all_token_ids), lora_request=None,
        mm_features=[], cache_salt=None, session_id=None)
    events = []
    for req in (full, bare):
        pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
        pool.cache_partial_block(req, blocks[1], 6, 0, 8)
        events.append(pool.take_events())
    assert events[0] == events[1] and len(events[0]) == 2


# ------------------------------------------------------------ the coarse hash view


def test_coarse_view_refuses_a_zero_hash_block_size() -> None:
    with pytest.raises(ValueError, match="positive multiple"):
        BlockHashListWithBlockSize([b"a"], 0, 4)

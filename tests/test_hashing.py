"""Block hashing: chained, stable across processes, and injective on its inputs."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from kvpool.impl.hashing import (
    NONE_HASH,
    BlockHashListWithBlockSize,
    generate_block_hash_extra_keys,
    get_request_block_hasher,
    hash_block_tokens,
    resolve_block_hashes,
    to_event_extra_keys,
)
from kvpool.impl.keys import get_block_hash, get_group_id, make_block_hash_with_group_id
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
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
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

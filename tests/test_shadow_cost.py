"""What keeps the shadow's cost per call independent of a prompt's length and of the run's length.

The caller-contract check of a write walks from the written prefix to what
the block held (``model/request.py``'s ``Prefix.up_to``): with each prefix's
skew-binary ``jump`` the walk takes steps logarithmic in the distance, not
linear (a 16,384-block prompt cached 512 blocks a call was quadratic).  The
engine's side sends only the blocks a ``cache_full_blocks`` call caches, and
forgets a request once it is gone.  Times are ``benchmarks/shadow_prompt_length.py``'s.
"""

from __future__ import annotations

import math
import random

from kvpool.impl import BlockPool, Request, get_request_block_hasher
from kvpool.model.request import EMPTY, Prefix, extends
from kvpool.oracle.shadow import ShadowPool, shadow_of
from kvpool.oracle.shadow.messages import expand


def chain(n: int) -> list[Prefix]:
    prefixes = [EMPTY]
    for i in range(n):
        prefixes.append(prefixes[-1].then(((i,), None)))
    return prefixes


def steps(longer: Prefix, depth: int) -> int:
    """The steps ``up_to`` takes, walked here as it walks (jump if it does not overshoot, else parent)."""
    p, n = longer, 0
    while p.depth > depth:
        p = p.jump if p.jump.depth >= depth else p.parent  # type: ignore[assignment]
        n += 1
    return n


def test_a_prefix_reaches_any_ancestor_in_logarithmic_steps() -> None:
    prefixes = chain(1 << 14)
    rng = random.Random(0)
    for _ in range(400):
        a = rng.randrange(len(prefixes))
        b = rng.randrange(a + 1)
        assert prefixes[a].up_to(b) is prefixes[b]
        assert steps(prefixes[a], b) <= 3 * math.log2(a - b + 2) + 3, (a, b)
    assert steps(prefixes[-1], 0) <= 3 * 14 + 3  # a fresh block of the longest prompt
    assert extends(prefixes[-1], EMPTY) and not extends(prefixes[5], prefixes[6])


def test_jumps_follow_the_skew_binary_rule() -> None:
    """Each jump is to the parent, or (when the parent's two spans are equal) past both."""
    for p in chain(600)[1:]:
        parent = p.parent
        assert parent is not None
        up = parent.jump
        equal = parent.depth - up.depth == up.depth - up.jump.depth
        assert p.jump is (up.jump if equal else parent)


def test_a_cache_call_sends_only_the_blocks_it_caches() -> None:
    pool = ShadowPool(BlockPool(64, True, 4))
    found = shadow_of(pool)
    sent: list[tuple[object, ...]] = []
    send = found.hub.send
    found.hub.send = lambda message: (sent.append(message), send(message))  # type: ignore[method-assign]
    req = Request("r", list(range(4 * 40)), block_hasher=get_request_block_hasher(4))
    blocks = pool.get_new_blocks(40)
    pool.cache_full_blocks(req, blocks, 0, 32, 4, 0)
    pool.cache_full_blocks(req, blocks, 32, 40, 4, 0)
    calls = [m for m in sent if m[0] == "call" and m[2] == "cache_full_blocks"]
    second = calls[1][3][1]
    start, ids, total = second  # a slice: only the 8 blocks the second call caches
    assert type(second) is tuple and start == 32 and len(ids) == 8 and total == 40
    assert expand(second)[32:] == [b.block_id for b in blocks[32:]] and expand(second)[:32] == [0] * 32


def test_a_request_gone_is_forgotten_on_the_engines_side() -> None:
    pool = ShadowPool(BlockPool(64, True, 4))
    known = shadow_of(pool).hub.requests.known
    before = len(known)
    for i in range(50):
        req = Request(f"r{i}", list(range(8)), block_hasher=get_request_block_hasher(4))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
        pool.free_blocks(blocks)
        del req
    assert len(known) <= before + 1

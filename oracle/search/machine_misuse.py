"""The state machine's wrong calls, made only for a pool that refuses misuse.

Each rule makes one deliberately wrong call, of a kind drawn by name, that
the model refuses with a typed error; the pool must refuse it alike and
change nothing.  Three families, one rule each, so that a shrunk failure
names its family: calls on the wrong blocks or counts (``misuse``), calls
with one bad argument or a cache entry the model refuses
(``misuse_argument``), and calls on the first pool with a block of the
second (``misuse_other``: a double free through the first pool, or a block
not of this pool, which the first model sees as an id outside it, as
:class:`~kvpool.oracle.core.lockstep.Lockstep`'s ``foreign`` block).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvpool.model.state import NULL

from .machine_draws import Prompt, Table
from .machine_state import MachineState, others

MISUSES = (
    "free_idle", "over_free", "unpin_idle", "unpin_null", "touch_unknown", "too_many",
    "negative_count", "mask_length", "evict_unknown", "move_onto_hashed", "move_onto_null",
    "partial_bad_tokens", "cache_disabled", "insert_null", "insert_unnamed", "insert_no_tokens",
)
"""Deliberately wrong calls; the model refuses each with a typed error."""
CACHE_ENTRY_MISUSES = frozenset({"move_onto_hashed", "move_onto_null", "insert_null", "insert_unnamed",
                                 "insert_no_tokens"})
"""Kinds that need a pool with caching; without it they become ``cache_disabled``."""
ARGUMENT_MISUSES = (
    "bad_group", "bad_block_size", "uncallable_watcher", "full_beyond_list", "full_too_few_hashes",
    "cache_conflict", "partial_at_block_end", "partial_too_few_hashes", "emit_too_many",
)
"""Calls with one bad argument or a cache entry the model refuses; one fault each."""
OTHER_POOL_MISUSES = ("other_over_free", "other_touch", "other_unpin", "other_writable", "other_move")
"""Deliberately wrong calls on the first pool with a block of the second."""


class MisuseRules(MachineState):
    """Rules that make wrong calls (see the module docstring)."""

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(MISUSES), pick=st.integers(0, 7))
    def misuse(self, kind: str, pick: int) -> None:
        """One deliberately wrong call; both sides must refuse it alike (and change nothing)."""
        m = self.lock.model
        idle = [b for b in range(1, m.num_blocks) if m.ref[b] == 0]
        used = [b for b in range(1, m.num_blocks) if m.ref[b] > 0]
        hashed = [b for b in range(1, m.num_blocks) if m.primary[b] is not None]
        block = 1 + pick % (m.num_blocks - 1)  # any real block: each call is refused before it writes
        bs = self.cfg.block_sizes[0]
        call = self.lock.maybe  # a wrong call with something the pool lacks is not made
        if not self.cfg.caching and kind in CACHE_ENTRY_MISUSES:
            kind = "cache_disabled"  # as the campaign's: without caching, any cache entry is refused as such
        if kind == "free_idle" and idle:
            call("free_blocks", [idle[pick % len(idle)]])
        elif kind == "over_free" and used:
            b = used[pick % len(used)]
            call("free_blocks", [a for a in used if a != b][:1] + [b] * (m.ref[b] + 1))
        elif kind == "unpin_idle" and idle:
            call("unpin_blocks", [idle[pick % len(idle)]], self.lock.watcher("bad"))
        elif kind == "unpin_null":
            call("unpin_blocks", [NULL], self.lock.watcher("bad"))
        elif kind == "touch_unknown":
            call("touch", [*used[:1], m.num_blocks + pick])
        elif kind == "too_many":
            call("get_new_blocks", len(m.free) + 1 + pick)
        elif kind == "negative_count":
            call("get_new_blocks", -1 - pick)
        elif kind == "mask_length":
            call("cache_full_blocks", self._request(Prompt(0, 8)), [block], 0, 1, bs, 0, [True, False])
        elif kind == "evict_unknown":
            call("evict_blocks", [m.num_blocks + pick if pick % 2 else -1 - pick])
        elif kind == "move_onto_hashed" and hashed:
            call("move_block_hashes", block, hashed[pick % len(hashed)])
        elif kind == "move_onto_null" and hashed:
            call("move_block_hashes", hashed[pick % len(hashed)], NULL)
        elif kind == "partial_bad_tokens":
            call("cache_partial_block", self._request(Prompt(0, 8)), block,
                 -self.cfg.hash_block_size * (pick % 2), 0, bs * 2)
        elif kind == "cache_disabled" and not self.cfg.caching:  # both cache operations refused
            req = self._request(Prompt(0, 8))
            call("cache_full_blocks", req, [block], 0, 1, bs, 0)
            call("cache_partial_block", req, block, self.cfg.hash_block_size, 0, 2 * self.cfg.hash_block_size)
            if self.lock.supports("_insert_block_hash"):
                call("_insert_block_hash", req, self.cfg.hash_block_size, 0, block, self.cfg.hash_block_size)
        elif kind.startswith("insert_") and self.cfg.caching and self.lock.supports("_insert_block_hash"):
            hbs = self.cfg.hash_block_size
            unhashed = [b for b in range(1, m.num_blocks) if m.primary[b] is None] or [NULL]
            target, upto, tokens = {  # onto the null block; a primary with no token count; no key
                "insert_null": (NULL, hbs, hbs),
                "insert_no_tokens": (unhashed[pick % len(unhashed)], hbs, None),
                "insert_unnamed": (block, 0, hbs)}[kind]
            call("_insert_block_hash", self._request(Prompt(0, 8)), upto, 0, target, tokens)

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(ARGUMENT_MISUSES), pick=st.integers(0, 7))
    def misuse_argument(self, kind: str, pick: int) -> None:
        """A call with one bad argument, or a cache entry the model refuses; refused alike, no change.

        Each call has one fault, so the refusal it must get is not a matter of which check a pool
        makes first.
        """
        m = self.lock.model
        hbs, bs = self.cfg.hash_block_size, self.cfg.block_sizes[0]
        block = 1 + pick % (m.num_blocks - 1)  # any real block: each call is refused before it writes
        unhashed = [b for b in range(1, m.num_blocks) if m.primary[b] is None]
        cached_whole = [b for b, p in enumerate(m.primary) if p is not None and p.num_tokens >= bs]
        prompt = self._request(Prompt(0, 12))
        call = self.lock.maybe  # a wrong call with something the pool lacks is not made
        if kind == "bad_group":
            group = (-1, 2**32)[pick % 2]
            call("cache_full_blocks", prompt, [block], 0, 1, bs, group)
        elif kind == "bad_block_size":
            call("cache_full_blocks", prompt, [block], 0, 1, (0, -hbs, hbs + 1)[pick % (2 + (hbs > 1))], 0)
        elif kind == "uncallable_watcher":
            call("unpin_blocks", [block], None)
        elif kind == "full_beyond_list" and self.cfg.caching:
            call("cache_full_blocks", prompt, [block], 0, 2, bs, 0)
        elif kind == "full_too_few_hashes" and unhashed and self.cfg.caching:
            call("cache_full_blocks", self._request(Prompt(0, 0)), [unhashed[pick % len(unhashed)]],
                 0, 1, bs, 0)
        elif kind == "cache_conflict" and cached_whole:
            call("cache_full_blocks", self._request(Prompt(pick % 2, 32)),
                 [cached_whole[pick % len(cached_whole)]], 0, 1, bs, 0)
        elif kind == "partial_at_block_end" and self.cfg.caching and not m.boundary_partials:
            call("cache_partial_block", prompt, block, hbs * (1 + pick % 3), 0, hbs)
        elif kind == "partial_too_few_hashes" and unhashed:
            call("cache_partial_block", self._request(Prompt(0, 0)), unhashed[pick % len(unhashed)],
                 hbs, 0, 2 * hbs)
        elif kind == "emit_too_many":  # refused only with events on
            call("emit_cached_block_events", prompt, len(prompt.block_hashes) + 1 + pick, hbs, 0)

    @precondition(lambda self: self.MISUSE)
    @rule(kind=st.sampled_from(OTHER_POOL_MISUSES), theirs=others, pick=st.integers(0, 7))
    def misuse_other(self, kind: str, theirs: Table, pick: int) -> None:
        """A wrong call on the first pool with a block of the second; both refuse, neither changes.

        Freeing it too often is a double free (the second model says so); any other operation
        refuses it as a block not of this pool (the first model's id outside the pool, handed to
        the pool as this block: ``Lockstep.foreign``).
        """
        if not theirs.live:
            return
        second, m = self._second(), self.lock.model
        b = theirs.ids[pick % len(theirs.ids)]
        used = [a for a in range(1, m.num_blocks) if m.ref[a] > 0]
        if kind == "other_over_free":
            self._free_across(used[:1], [b] * (second.model.ref[b] + 1), pick % 2 == 1)
            return
        stand_in = m.num_blocks + pick  # an id the first model does not know
        saved, self.lock.foreign = self.lock.foreign, second.pool.blocks[b]
        try:
            if kind == "other_touch":
                self.lock.maybe("touch", [*used[:1], stand_in])
            elif kind == "other_unpin":
                self.lock.maybe("unpin_blocks", [*used[:1], stand_in], self.lock.watcher("bad"))
            elif kind == "other_writable":
                self.lock.maybe("is_block_writable", stand_in)
            elif kind == "other_move":
                self.lock.maybe("move_block_hashes", pick % m.num_blocks, stand_in)
        finally:
            self.lock.foreign = saved
        second.check()

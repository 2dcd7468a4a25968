"""The state machine's rules on blocks held outside requests, and on a second pool's blocks.

What a pool's other callers do besides serving requests: scratch blocks,
copy-on-write copies that take a block's hashes, CPU-offload copies indexed
under another pool's keys, one holder listing a block several times, null
placeholders offered for caching, and blocks of a second pool of the same
implementation freed through the first (alone, or mixed with its own in one
``free_blocks``), as vLLM's ``free_blocks`` allows.  Each rule's blocks go
into a bundle (``tables``, ``others``) that a later rule releases.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import consumes, multiple, rule

from kvpool.model import Refusal
from kvpool.model.state import NULL

from ..generate.capabilities import SKIPPED
from ..generate.runs import Running
from .machine_draws import Prompt, Table, prompts
from .machine_state import MachineState, others, runs, tables


class BlockRules(MachineState):
    """Rules on held blocks and the second pool's (see the module docstring)."""

    def _new_table(self, n: int) -> Table | None:
        """``n`` new blocks held outside any request (None: the pool has them not, or lacks them)."""
        got = self.lock.maybe("get_new_blocks", n)
        if got is SKIPPED or isinstance(got, Refusal):
            return None
        table = Table(list(got))
        self.held.append(table)
        return table

    @rule(target=tables, n=st.integers(0, 3))
    def allocate(self, n: int) -> Any:
        """Blocks held outside any request (e.g. scratch for a copy)."""
        return self._new_table(n) or multiple()

    @rule(target=tables, run=runs, group=st.integers(0, 1))
    def copy_last_block(self, run: Running, group: int) -> Any:
        """Copy-on-write: the hashes of a request's last block (if any) move to a fresh copy."""
        if not self._alive(run) or group not in run.tables or not run.tables[group]:
            return multiple()
        table = self._new_table(1)
        if table is None:
            return multiple()
        self.lock.maybe("move_block_hashes", run.tables[group][-1], table.ids[0])
        return table

    @rule(target=tables, run=runs, group=st.integers(0, 1), upto=st.integers(1, 16),
          shorter=st.none() | st.integers(1, 16))
    def offload_copy(self, run: Running, group: int, upto: int, shorter: int | None) -> Any:
        """vLLM's CPU offload pool: a fresh block receives KV another pool cached, under its keys
        (a prefix's as primary, maybe a shorter one's as secondary)."""
        hbs = self.cfg.hash_block_size
        chunks = len(run.request.block_hashes)
        if (not self._alive(run) or not chunks or group not in self.cfg.block_sizes
                or not self.cfg.caching or not self.lock.supports("_insert_block_hash")):
            return multiple()
        table = self._new_table(1)
        if table is None:
            return multiple()
        upto = hbs * (1 + (upto - 1) % chunks)
        self.lock.maybe("_insert_block_hash", run.request, upto, group, table.ids[0], upto)
        if shorter is not None:
            self.lock.maybe("_insert_block_hash", run.request, hbs * (1 + (shorter - 1) % (upto // hbs)),
                            group, table.ids[0], None)
        return table

    @rule(table=consumes(tables))
    def release(self, table: Table) -> None:
        """Free held blocks in one call; a block held several times is listed as often."""
        if table.live:
            table.live = False
            self.lock.maybe("free_blocks", table.ids)

    @rule(table=consumes(tables), reader=st.sampled_from(["reader1", "reader2"]))
    def unpin_held(self, table: Table, reader: str) -> None:
        """Held blocks handed to a ``reader`` in one ``unpin_blocks``, each listing one reference."""
        if table.live:
            table.live = False
            watcher = self.lock.watcher(reader)
            if self.lock.can("unpin_blocks", table.ids, watcher):
                self.lock.call("unpin_blocks", table.ids, watcher)
            else:  # a pool without readers: the blocks are freed
                self.lock.maybe("free_blocks", table.ids)

    @rule(target=tables, pick=st.integers(0, 15), times=st.integers(2, 3))
    def share(self, pick: int, times: int) -> Any:
        """One holder takes ``times`` references on one block in a single ``touch``.

        Released by listing it as often in one call: a pool that queues a block once per
        listing corrupts its free queue.
        """
        m = self.lock.model
        candidates = [b for b in range(1, m.num_blocks) if m.ref[b] > 0 or m.primary[b] is not None]
        if not candidates or "listed_twice" in self.LACKS:
            return multiple()
        table = Table([candidates[pick % len(candidates)]] * times)
        if self.lock.maybe("touch", table.ids) is SKIPPED:
            return multiple()
        self.held.append(table)
        return table

    @rule(target=others, n=st.integers(1, 3), prompt=st.none() | prompts)
    def allocate_other(self, n: int, prompt: Prompt | None) -> Any:
        """Blocks of a second pool (an engine with several pools), cached there if ``prompt``; freed
        through the first pool, cached ones must go to the tail of the second pool's queue."""
        if "second_pool" in self.LACKS:
            return multiple()
        second = self._second()
        got = second.maybe("get_new_blocks", n)
        if got is SKIPPED or isinstance(got, Refusal):
            return multiple()
        if prompt is not None and self.cfg.caching:
            req = self._request(prompt)
            bs = self.cfg.block_sizes[0]
            second.maybe("cache_full_blocks", req, list(got), 0, min(len(got), req.num_tokens // bs), bs, 0)
        return Table(list(got))

    @rule(theirs=consumes(others), reverse=st.booleans())
    def release_other(self, theirs: Table, reverse: bool) -> None:
        """Free the second pool's blocks through the first pool: the second takes them back."""
        if theirs.live:
            theirs.live = False
            self._free_across([], theirs.ids[::-1] if reverse else theirs.ids, False)

    @rule(theirs=consumes(others), mine=consumes(tables), interleave=st.booleans())
    def release_mixed(self, theirs: Table, mine: Table, interleave: bool) -> None:
        """One ``free_blocks`` call with the first pool's blocks and the second's, maybe interleaved."""
        own = mine.ids if mine.live else []
        other = theirs.ids if theirs.live else []
        mine.live = theirs.live = False
        self._free_across(own, other, interleave)

    @rule(prompt=prompts, placeholders=st.integers(1, 3), partial=st.booleans())
    def cache_placeholders(self, prompt: Prompt, placeholders: int, partial: bool) -> None:
        """Null placeholders in the range to cache are skipped, never hashed; with ``partial``, the
        null block offered for a partial entry registers nothing."""
        bs = self.cfg.block_sizes[0]
        req = self._request(prompt)
        if partial and req.block_hashes:
            self.lock.maybe("cache_partial_block", req, NULL, self.cfg.hash_block_size, 0, bs)
        elif self.cfg.caching:
            n = min(placeholders, len(self.work._hashes(req, 0)))
            self.lock.maybe("cache_full_blocks", req, [NULL] * n, 0, n, bs, 0)

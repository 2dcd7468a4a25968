"""The state machine's rules on requests: scheduled, decoded, finished, continued, cached as an engine does.

A request's life as vLLM's KV-cache manager plays it, each choice a drawn
argument: its prefix looked up and touched (with sliding-window null
placeholders), its blocks allocated and cached after every step (block
masks, partial entries and their promotion), preempted when the pool runs
dry, freed or unpinned for a reader when it finishes, continued by a
follow-up turn or sampled again while it runs.  The partial entries and
re-keying a request may make on its own blocks are the workload's legal
options (:mod:`kvpool.oracle.generate.entries`), picked by drawn indices.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import consumes, multiple, rule

from kvpool.impl.request import Request
from kvpool.model.state import NULL

from ..generate.capabilities import SKIPPED
from ..generate.entries import partial_spots, rekey, rewritable
from ..generate.runs import Running
from .machine_draws import Prompt, masks, prompts, skips
from .machine_state import MachineState, finished, runs


class RequestRules(MachineState):
    """Rules that serve requests (see the module docstring)."""

    @rule(target=finished, prompt=prompts)
    def served(self, prompt: Prompt) -> Any:
        """A short request admitted and finished at once: its prefix stays cached and idle, for
        later requests to hit and ``follow_up`` to continue."""
        run = self._admit(self._request(self._fitted(prompt)), False, False, False, None, 0)
        if not isinstance(run, Running):
            return multiple()
        self._drop(run)
        return run

    @rule(target=runs, prompt=prompts, skip_lookup=st.booleans(), emit=st.booleans(),
          skip_partial=skips, mask=masks, window=st.integers(0, 2))
    def admit(self, prompt: Prompt, skip_lookup: bool, emit: bool, skip_partial: bool,
              mask: tuple[bool, ...] | None, window: int) -> Any:
        """Schedule a new request: look up its prefix, touch the hits, allocate, cache.

        ``window`` leading hits become the null block (sliding window); ``emit`` announces the
        hits.  A prompt is cut to half the pool, as a scheduler admits no request it cannot hold.
        """
        return self._admit(self._request(self._fitted(prompt)), skip_lookup, emit, skip_partial, mask,
                           window)

    def _fitted(self, prompt: Prompt) -> Prompt:
        """``prompt`` cut to half the tokens the pool's real blocks hold in every group (a small pool
        still runs dry, with several requests)."""
        cfg = self.cfg
        per_group = (cfg.num_blocks - 1) // len(cfg.block_sizes)
        half = max(1, per_group * min(cfg.block_sizes.values()) // 2)
        return prompt if prompt.length <= half else replace(prompt, length=half)

    @rule(target=runs, run=consumes(finished), more=st.lists(st.integers(0, 49), max_size=4),
          skip_lookup=st.booleans(), emit=st.booleans(), skip_partial=skips, mask=masks,
          window=st.integers(0, 2))
    def follow_up(self, run: Running, more: list[int], skip_lookup: bool, emit: bool,
                  skip_partial: bool, mask: tuple[bool, ...] | None, window: int) -> Any:
        """The next turn of a finished conversation: its whole text plus ``more`` tokens, hitting
        what is still cached (idle blocks); ``window`` leading hits are null placeholders."""
        return self._admit(self._continued(run, more), skip_lookup, emit, skip_partial, mask, window)

    @rule(target=runs, run=runs, more=st.lists(st.integers(0, 49), max_size=2), emit=st.booleans(),
          skip_partial=skips, window=st.integers(0, 2))
    def fork(self, run: Running, more: list[int], emit: bool, skip_partial: bool, window: int) -> Any:
        """Another sample of a live request's prompt (parallel sampling, n > 1): it hits the blocks
        the first one cached while they are in use; ``window`` leading hits are null placeholders."""
        if not self._alive(run):
            return multiple()
        return self._admit(self._continued(run, more), False, emit, skip_partial, None, window)

    def _continued(self, run: Running, more: list[int]) -> Request:
        """A new request reading ``run``'s whole text and ``more``, with its extra keys."""
        old = run.request
        self.counter += 1
        return Request(f"r{self.counter}", [*old.all_token_ids, *more],
                       block_hasher=self.work.hasher, lora_request=old.lora_request,
                       cache_salt=old.cache_salt, mm_features=list(old.mm_features),
                       session_id=old.session_id)

    def _admit(self, req: Request, skip_lookup: bool, emit: bool, skip_partial: bool,
               mask: tuple[bool, ...] | None, window: int) -> Any:
        run = Running(req, {}, {})
        for group, bs in self.cfg.block_sizes.items():
            hits = [] if skip_lookup else self.work.lookup(req, group)  # as the workload looks up
            cut = min(window, max(len(hits) - 1, 0))
            if "null_block" not in self.LACKS:
                hits[:cut] = [NULL] * cut
            if not self.lock.can("touch", hits):
                hits = []  # hits the pool cannot take (an idle one, a watched one): computed again
            self.lock.call("touch", hits)
            run.tables[group] = hits
            run.cached[group] = len(hits)
            if emit:  # with no hits, or events off, there is nothing to announce
                self.lock.maybe("emit_cached_block_events", req, len(hits), bs, group)
            if not self.work._grow(run, group):
                self.work._release(run, unpin=False)
                return multiple()
            self._cache(run, group, skip_partial, mask)
        self.live[req.request_id] = run
        return run

    @rule(run=runs, tokens=st.lists(st.integers(0, 49), min_size=1, max_size=6),
          per_step=st.integers(1, 4), skip_partial=skips, mask=masks, slide=st.integers(0, 4))
    def decode(self, run: Running, tokens: list[int], per_step: int, skip_partial: bool,
               mask: tuple[bool, ...] | None, slide: int) -> None:
        """Engine steps: slide the window, then ``per_step`` tokens a step (append, grow, cache).

        ``slide`` above 2 frees ``slide - 2`` leading blocks; several tokens a step are speculative
        decoding.  A step the pool cannot grow preempts the request.
        """
        if not self._alive(run):
            return
        for group in run.tables:
            if "null_block" not in self.LACKS:
                self._slide(run, group, slide - 2)
        for start in range(0, len(tokens), per_step):
            run.request.append_output_token_ids(tokens[start:start + per_step])
            for group in run.tables:
                if not self.work._grow(run, group):
                    self._drop(run)  # preempted
                    return
                self._cache(run, group, skip_partial, mask)

    @rule(target=finished, run=consumes(runs),
          reader=st.sampled_from([None, "reader1", "reader2"]))
    def finish(self, run: Running, reader: str | None) -> Any:
        """Free a finished request's blocks, tail first; or unpin them for a ``reader``, whose
        watcher fires when they are reused."""
        if not self._alive(run):
            return multiple()
        watcher = self.lock.watcher(reader or "")
        if reader is None or not all(self.lock.can("unpin_blocks", [b for b in t if b != NULL], watcher)
                                     for t in run.tables.values()):
            self._drop(run)  # freed: a pool without readers is not asked to keep them
            return run
        self.live.pop(run.request.request_id)
        for table in run.tables.values():
            self.lock.call("unpin_blocks", [b for b in reversed(table) if b != NULL], watcher)
        return run

    @rule(run=runs, group=st.integers(0, 1), pick=st.integers(0, 31), again=st.booleans())
    def partial_inside(self, run: Running, group: int, pick: int, again: bool) -> None:
        """A partial entry at a chunk boundary of one of a request's blocks, up to what it wrote.

        A block cached further gains a secondary key; the last, partly written block an entry
        the next step's replaces.  With ``again`` it is registered twice: no change, no event.
        """
        if not self.cfg.caching or not self._alive(run) or group not in run.tables:
            return
        spots = partial_spots(run, group, self.cfg, self.lock.model.boundary_partials)
        if not spots:
            return
        i, tokens = spots[pick % len(spots)]
        for _ in range(1 + again):
            self.lock.maybe("cache_partial_block", run.request, run.tables[group][i], tokens, group,
                            self.cfg.block_sizes[group])

    @rule(run=runs, group=st.integers(0, 1), pick=st.integers(0, 15), position=st.integers(0, 15))
    def rewrite(self, run: Running, group: int, pick: int, position: int) -> None:
        """A request rewrote a block it alone holds (a state checkpoint) and re-keys it: its entries
        evicted, then ``replace_existing_hashes`` at a chunk boundary of what it wrote."""
        if not self.cfg.caching or not self._alive(run) or group not in run.tables:
            return
        options = rewritable(self.lock, run, group, self.cfg)
        if not options:
            return
        i, chunks = options[pick % len(options)]
        rekey(self.lock, run, group, self.cfg, i, 1 + position % chunks)

    @rule(run=runs, group=st.integers(0, 1), fewer=st.integers(0, 15))
    def sparse_cache(self, run: Running, group: int, fewer: int) -> None:
        """vLLM's sparse-attention coordinator asks to cache fewer blocks than are cached: a no-op."""
        if not self._alive(run) or group not in run.tables or not run.cached[group]:
            return
        cached = run.cached[group]
        self.lock.maybe("cache_full_blocks", run.request, run.tables[group], cached, fewer % cached,
                        self.cfg.block_sizes[group], group)

    def _cache(self, run: Running, group: int, skip_partial: bool,
               mask: tuple[bool, ...] | None) -> None:
        """Index what filled up, and (unless skipped) the prefix ending inside the last block (at
        its end too under vLLM 0.33), as the engine does after each step."""
        cfg, req = self.cfg, run.request
        bs = cfg.block_sizes[group]
        full = req.num_tokens // bs
        if not cfg.caching:
            return
        new = full - run.cached[group]
        args: list[Any] = [req, run.tables[group], run.cached[group], full, bs, group]
        if mask is not None and new > 0 and "mask" not in self.LACKS:
            args.append([mask[i % len(mask)] for i in range(new)])
        if self.lock.maybe("cache_full_blocks", *args) is not SKIPPED:
            run.cached[group] = max(run.cached[group], full)
        upto = (req.num_tokens // cfg.hash_block_size) * cfg.hash_block_size
        if not skip_partial and upto and (upto % bs or self.lock.model.boundary_partials):
            self.lock.maybe("cache_partial_block", req, run.tables[group][(upto - 1) // bs], upto,
                            group, bs)

    def _slide(self, run: Running, group: int, cut: int) -> None:
        """Sliding window: cached blocks before ``cut`` are freed and become the null block."""
        table = run.tables[group]
        limit = len(table) - 1
        if self.cfg.caching:
            limit = min(limit, run.cached[group])
        cut = min(cut, limit)
        gone = [b for b in table[:cut] if b != NULL]
        if cut > 0 and gone:
            table[:cut] = [NULL] * cut
            self.lock.call("free_blocks", list(reversed(gone)))

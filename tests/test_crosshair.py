"""CrossHair checks the contracts of kvpool.oracle.contracts, in bounded time.

The contracts (PEP 316 docstrings on thin wrappers around kvpool.impl) say
what the free queue, the hash index and the pool's get_new_blocks /
free_blocks / touch must do on small inputs, from fresh pools; and what
get_new_blocks, free_blocks, touch, unpin_blocks, evict_blocks and
cache_full_blocks must do from the states the bounded refinement reaches
(``REACHED``, one picked by a symbolic index): agree with the model on
everything the lockstep compares.  CrossHair searches for arguments that
meet a precondition and break a postcondition.

A green run could also mean CrossHair explored nothing, so two more tests
must go red: hand-written contracts on deliberately broken pools, and the
real contracts module re-targeted at seeded pool bugs (partial effects left
behind by a refused touch / free, allocation from the wrong end, and one no
fresh pool shows: a cached block freed to the head of the queue).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# Per condition and per path budgets.  Conditions CrossHair cannot exhaust
# (index and pool wrappers) run to the condition budget: 4 s of CPU each, in
# two processes side by side per test.  4 s is about what the seeded pool bugs
# below need to be found; a found counterexample ends its condition early, so
# the mutant checks can afford a larger budget.
BUDGET = ["--per_condition_timeout", "4", "--per_path_timeout", "1"]
MUTANT_BUDGET = ["--per_condition_timeout", "15", "--per_path_timeout", "2"]
WALL_CLOCK = 240  # far above the expected time (the budgets are CPU time); only guards against a hang


def _command(targets: list[str], *extra: str, budget: list[str] = BUDGET) -> list[str]:
    return [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", *budget, *extra, *targets]


def _env(cwd: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if cwd is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")])
    return env


def _crosshair(target: str, cwd: Path | None = None, *extra: str,
               budget: list[str] = BUDGET) -> subprocess.CompletedProcess[str]:
    """Run ``crosshair check`` on ``target`` with this interpreter's CrossHair."""
    return subprocess.run(_command([target], *extra, budget=budget), capture_output=True, text=True,
                          timeout=WALL_CLOCK, cwd=cwd, env=_env(cwd), check=False)


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if ": error:" in line]


# Two groups of about equal cost (the pool wrappers run to their timeout; the
# free-queue ones are proved in well under a second), checked side by side.
GROUPS = [
    ["queue_remove", "queue_remove_twice_refused", "queue_append", "queue_popleft_n",
     "queue_prepend_n", "queue_append_n_order", "index_insert_contains", "index_pop_exact",
     "pool_get_new_blocks"],
    ["pool_free_blocks", "pool_touch", "pool_free_after_touch"],
]
# The contracts from reached states, in a test of their own (so that pytest-xdist can
# run it beside the other), again in two processes.
REACHED_GROUPS = [
    ["pool_get_new_blocks_reached", "pool_free_blocks_reached", "pool_touch_reached"],
    ["pool_unpin_blocks_reached", "pool_evict_blocks_reached", "pool_cache_full_blocks_reached"],
]


def _check_groups(groups: list[list[str]]) -> list[tuple[str, str]]:
    """Run each group in its own process; no counterexample; each condition's (line, status)."""
    procs = [subprocess.Popen(_command([f"kvpool.oracle.contracts.{w}" for w in group], "--report_all"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for group in groups]
    outputs = [proc.communicate(timeout=WALL_CLOCK)[0] for proc in procs]
    out = "\n".join(outputs)
    assert all(proc.returncode == 0 for proc in procs) and not _errors(out), out
    return re.findall(r"contracts\.py:(\d+): info: (.*)", out)


def _posts(source: str, names: list[str]) -> int:
    """How many postconditions the wrappers ``names`` carry."""
    return sum(source.split(f"\ndef {name}(")[1].split("\ndef ")[0].count("    post: ") for name in names)


def test_every_wrapper_is_checked() -> None:
    from kvpool.oracle import contracts

    source = Path(contracts.__file__).read_text()
    wrappers = re.findall(r"^def ([a-z]\w*)\(", source, re.MULTILINE)
    checked = [w for group in GROUPS + REACHED_GROUPS for w in group]
    assert sorted(wrappers) == sorted(checked), "add new wrappers to GROUPS or REACHED_GROUPS"


def test_contracts_of_impl_hold() -> None:
    """No counterexample to any contract; the free-queue ones are proved over all paths."""
    from kvpool.oracle import contracts

    source = Path(contracts.__file__).read_text()
    statuses = _check_groups(GROUPS)
    # Every postcondition was analysed (CrossHair reports one line per condition).
    assert len(statuses) == _posts(source, [w for group in GROUPS for w in group]), statuses
    confirmed = sum(1 for _, status in statuses if status.startswith("Confirmed over all paths"))
    assert confirmed >= 5, statuses


def test_contracts_from_reached_states_hold() -> None:
    """From every state CrossHair picks in REACHED, no counterexample within the budget.

    None is confirmed over all paths in 4 s (docs/verification.md has what a longer
    budget confirms); that the search finds what it should is the mutant test below.
    """
    from kvpool.oracle import contracts

    source = Path(contracts.__file__).read_text()
    statuses = _check_groups(REACHED_GROUPS)
    assert len(statuses) == _posts(source, [w for group in REACHED_GROUPS for w in group]), statuses


BROKEN = '''
from kvpool.impl.errors import BlockPoolError
from kvpool.impl.pool import BlockPool


class NoUndoFree(BlockPool):
    """A double free is refused but the references already dropped stay dropped."""

    def _undo_release(self, blocks, done):
        pass


class TouchLeavesBlockQueued(BlockPool):
    """touch takes the reference but leaves an idle block in the free queue."""

    def touch(self, blocks):
        for block in blocks:
            block.ref_cnt += 1


def refused_free_changes_nothing(n: int, held: int, ids: list[int]) -> bool:
    """
    pre: 2 <= n <= 4
    pre: 0 <= held < n
    pre: len(ids) <= 3
    pre: all(0 <= i < n for i in ids)
    post: __return__
    """
    pool = NoUndoFree(n, True, 16)
    pool.get_new_blocks(held)
    before = [b.ref_cnt for b in pool.blocks]
    try:
        pool.free_blocks([pool.blocks[i] for i in ids])
    except BlockPoolError:
        return [b.ref_cnt for b in pool.blocks] == before
    return True


def touched_blocks_are_not_free(n: int, held: int, ids: list[int]) -> bool:
    """
    pre: 2 <= n <= 4
    pre: 0 <= held < n
    pre: len(ids) <= 3
    pre: all(1 <= i < n for i in ids)
    post: __return__
    """
    pool = TouchLeavesBlockQueued(n, True, 16)
    pool.get_new_blocks(held)
    pool.touch([pool.blocks[i] for i in ids])
    free = pool.free_block_queue.get_all_free_blocks()
    return all(b.ref_cnt == 0 for b in free) and pool.get_num_free_blocks() == len(free)
'''


@pytest.mark.parametrize("wrapper", ["refused_free_changes_nothing", "touched_blocks_are_not_free"])
def test_broken_pool_is_reported(tmp_path: Path, wrapper: str) -> None:
    """CrossHair finds the counterexample to a contract that a broken pool breaks."""
    (tmp_path / "broken_contracts.py").write_text(textwrap.dedent(BROKEN))
    result = _crosshair(f"broken_contracts.{wrapper}", tmp_path)
    errors = _errors(result.stdout + result.stderr)
    assert result.returncode != 0 and errors, result.stdout + result.stderr
    assert any(f"calling {wrapper}(" in line for line in errors), errors


MUTANTS = {
    # touch refused at a foreign block, but the blocks already taken out of
    # the free queue stay out (and keep their extra reference).
    "touch_keeps_partial_effect": "    def _undo_touch(self, blocks, unlinked_after):\n        pass\n",
    # free_blocks refused at an over-release, but earlier releases stay done.
    "free_keeps_partial_effect": "    def _undo_release(self, blocks, done):\n        pass\n",
    # get_new_blocks hands out blocks from the tail of the queue.
    "allocate_from_tail": ("    def get_new_blocks(self, num_blocks):\n"
                           "        out = super().get_new_blocks(num_blocks)\n"
                           "        return out[::-1]\n"),
    # a cached block is freed to the head of the queue, to be evicted first: only a pool
    # holding a cached block shows it, so only the contracts from reached states can
    "free_cached_to_head": ("    def free_blocks(self, ordered_blocks):\n"
                            "        caching, self.enable_caching = self.enable_caching, False\n"
                            "        try:\n"
                            "            super().free_blocks(ordered_blocks)\n"
                            "        finally:\n"
                            "            self.enable_caching = caching\n"),
}
TARGETS = {"touch_keeps_partial_effect": "pool_touch", "free_keeps_partial_effect": "pool_free_blocks",
           "allocate_from_tail": "pool_get_new_blocks", "free_cached_to_head": "pool_free_blocks_reached"}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_real_contracts_catch_a_seeded_pool_bug(tmp_path: Path, mutant: str) -> None:
    """kvpool.oracle.contracts itself, run on a broken BlockPool, reports a counterexample."""
    from kvpool.oracle import contracts

    source = Path(contracts.__file__).read_text()
    original = "from kvpool.impl.pool import BlockPool\n"
    assert original in source
    broken = ("from kvpool.impl.pool import BlockPool as _Correct\n\n\n"
              "class BlockPool(_Correct):\n" + MUTANTS[mutant])
    source = source.replace(original, broken).replace("from .", "from kvpool.oracle.")
    (tmp_path / "mutant_contracts.py").write_text(source)
    target = TARGETS[mutant]
    result = _crosshair(f"mutant_contracts.{target}", tmp_path, budget=MUTANT_BUDGET)
    errors = _errors(result.stdout + result.stderr)
    assert result.returncode != 0 and any(f"calling {target}(" in line for line in errors), (
        result.stdout + result.stderr)


FEATURES = ("held", "shared", "idle and cached", "held and cached", "secondary keys", "watched",
            "group 1", "partial entry", "a key on two blocks", "pending events")
"""What a reached state may hold that a fresh pool does not."""


def _features(state: Any) -> set[str]:
    real = range(1, state.num_blocks)
    found = (any(state.ref[b] for b in real), any(state.ref[b] > 1 for b in real),
             any(state.primary[b] for b in state.free),
             any(state.ref[b] and state.primary[b] for b in real), any(state.secondary),
             bool(state.watchers), any(group == 1 for _, group in state.index),
             any(p is not None and p.num_tokens % 2 for p in state.primary),
             any(len(blocks) > 1 for blocks in state.index.values()), bool(state.events))
    return {name for name, present in zip(FEATURES, found, strict=True) if present}


def _by_name(call: tuple[str, tuple[Any, ...]]) -> tuple[str, tuple[Any, ...]]:
    """A call with its requests and watchers named, as REACHED names them."""
    op, args = call
    return op, tuple(getattr(a, "request_id", None) or getattr(a, "__name__", None) or a
                     if not isinstance(a, (int, list, bool)) and a is not None else a for a in args)


def test_the_reached_states_are_the_refinements() -> None:
    """Each sequence of REACHED is one the bounded refinement runs: every call is in the BMC's
    domain from the state before it, none breaks a contract, and kvpool.impl agrees with the
    model all along; together they hold everything a fresh pool does not."""
    from kvpool.impl import BlockPool
    from kvpool.oracle.contracts import REACHED
    from kvpool.oracle.refinement import Shape, model_watcher, replay, requests_for
    from kvpool.verify.phase_refinement import bmc_domain

    shape = Shape(4, 1)
    calls, _, _ = bmc_domain(shape)
    requests = {r.request_id: r for r in requests_for(1)}
    assert len(REACHED) == len(set(map(repr, REACHED))) and () in REACHED
    features: set[str] = set()
    for sequence in REACHED:
        path = [(op, tuple((requests[a] if a in requests else model_watcher(a))
                           if isinstance(a, str) else a for a in args)) for op, args in sequence]
        for done, call in enumerate(sequence):
            before = replay(BlockPool, shape, path[:done]).model
            assert call in [_by_name(c) for c in calls(before)], (sequence, done)
        features |= _features(replay(BlockPool, shape, path).model)  # raises on any divergence
    assert features == set(FEATURES), features

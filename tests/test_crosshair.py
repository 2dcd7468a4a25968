"""CrossHair checks the contracts of tests/crosshair_contracts.py, bounded by paths, not time.

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
fresh pool shows: a cached block freed to the head of the queue), each found
within the same budget of paths the real check runs with.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CONTRACTS = Path(__file__).resolve().with_name("crosshair_contracts.py")
SOURCE = CONTRACTS.read_text()
DIRECTIVE = re.compile(r"^# crosshair: max_iterations=(\d+)$", re.MULTILINE)
PATHS = int(m[1]) if (m := DIRECTIVE.match(SOURCE)) else 0
"""Paths per postcondition: the directive on the contracts' first line (the CLI has no flag for it)."""

# CrossHair's own limits are CPU seconds per condition and per path (z3's per query: wall-clock
# seconds, half the path's), so a search they cut explores less on a loaded machine, and a
# seeded bug found at path 118 on a quiet one is missed on a busy one.  The search is bounded
# by PATHS instead (seeded and deterministic: the same paths every run, PYTHONHASHSEED fixed
# for good measure), and the time limits are set where they never bind.  (A finite condition
# limit also keeps --max_uninteresting_iterations off: with an infinite one CrossHair stops
# after 5 paths without progress.)
NEVER = ["--per_condition_timeout", "1e6", "--per_path_timeout", "1e5"]
HANG = 3600
"""Wall-clock seconds after which a crosshair process counts as hung: a loud failure, never a
verdict.  One process explores at most about 60 s of CPU; 8 times that was measured on a
2-core machine with a load of 10."""


def _command(targets: list[str], *extra: str) -> list[str]:
    # -P: the checkout's own kvpool/ folder must not shadow the installed package.
    return [sys.executable, "-P", "-m", "crosshair", "check", "--analysis_kind=PEP316", *NEVER, *extra,
            *targets]


def _env(path: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    # no empty entry: an empty PYTHONPATH entry is the current folder, whose kvpool/ would shadow the install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return env


def _run(groups: list[list[str]], path: Path, *extra: str) -> list[subprocess.CompletedProcess[str]]:
    """``crosshair check`` on each group of targets (modules on ``path``), side by side."""
    # cwd: CrossHair puts its working folder on the path; the checkout's kvpool/ must not shadow the install
    procs = [subprocess.Popen(_command(group, *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(path), cwd=path) for group in groups]
    done = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=HANG)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"crosshair check {' '.join(proc.args[-1:])} ran {HANG} s wall-clock: hung "
                        f"(its search is bounded by {PATHS} paths per condition, not by time)")
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return done


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if ": error:" in line]


def _contracts() -> ModuleType:
    """tests/crosshair_contracts.py, loaded by path (tests are no package)."""
    spec = importlib.util.spec_from_file_location("crosshair_contracts", CONTRACTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two groups of about equal cost (the pool wrappers run to PATHS; the free-queue ones are
# proved over all paths in well under a second), checked side by side.
GROUPS = [
    ["queue_remove", "queue_remove_twice_refused", "queue_append", "queue_popleft_n",
     "queue_prepend_n", "queue_append_n_order", "index_insert_contains", "index_pop_exact",
     "pool_get_new_blocks", "pool_free_after_touch"],
    ["pool_free_blocks", "pool_touch"],
]
# The contracts from reached states, in a test of their own (so that pytest-xdist can
# run it beside the other), again in two processes.
REACHED_GROUPS = [
    ["pool_get_new_blocks_reached", "pool_free_blocks_reached", "pool_touch_reached"],
    ["pool_unpin_blocks_reached", "pool_evict_blocks_reached", "pool_cache_full_blocks_reached"],
]


def _check_groups(groups: list[list[str]]) -> list[tuple[str, str]]:
    """Run each group in its own process; no counterexample; each condition's (line, status)."""
    done = _run([[f"crosshair_contracts.{w}" for w in group] for group in groups], CONTRACTS.parent,
                "--report_all")
    out = "\n".join(proc.stdout for proc in done)
    assert all(proc.returncode == 0 for proc in done) and not _errors(out), out
    return re.findall(r"crosshair_contracts\.py:(\d+): info: (.*)", out)


def test_the_search_is_bounded_by_paths() -> None:
    """The budget is a number of paths, stated once, on the contracts' first line."""
    assert PATHS >= 100, "tests/crosshair_contracts.py must start with '# crosshair: max_iterations=N'"
    assert f"at most {PATHS} paths" in " ".join(SOURCE.split()), "its docstring states the bound"


def _posts(source: str, names: list[str]) -> int:
    """How many postconditions the wrappers ``names`` carry."""
    return sum(source.split(f"\ndef {name}(")[1].split("\ndef ")[0].count("    post: ") for name in names)


def test_every_wrapper_is_checked() -> None:
    wrappers = re.findall(r"^def ([a-z]\w*)\(", SOURCE, re.MULTILINE)
    checked = [w for group in GROUPS + REACHED_GROUPS for w in group]
    assert sorted(wrappers) == sorted(checked), "add new wrappers to GROUPS or REACHED_GROUPS"


@pytest.mark.slow  # 130 s: CrossHair over every contract; the seeded-bug cases below run by default
def test_contracts_of_impl_hold() -> None:
    """No counterexample to any contract; the free-queue ones are proved over all paths."""
    statuses = _check_groups(GROUPS)
    # Every postcondition was analysed (CrossHair reports one line per condition).
    assert len(statuses) == _posts(SOURCE, [w for group in GROUPS for w in group]), statuses
    confirmed = sum(1 for _, status in statuses if status.startswith("Confirmed over all paths"))
    assert confirmed >= 5, statuses


@pytest.mark.slow  # 240 s of CrossHair
def test_contracts_from_reached_states_hold() -> None:
    """From every state CrossHair picks in REACHED, no counterexample within PATHS paths.

    None is confirmed over all paths in that budget (docs/verification.md has what a longer
    search confirms); that the search finds what it should is the mutant test below.
    """
    statuses = _check_groups(REACHED_GROUPS)
    assert len(statuses) == _posts(SOURCE, [w for group in REACHED_GROUPS for w in group]), statuses


BROKEN = '''
from kvpool.impl.errors import BlockPoolError
from kvpool.impl.pool import BlockPool


class NoUndoFree(BlockPool):
    """A double free is refused but the references already dropped stay dropped."""

    def _undo_release(self, *args):
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


def _finds(module: str, source: str, target: str, tmp_path: Path) -> None:
    """``crosshair check`` on ``target`` of ``source`` (within PATHS paths) finds a false postcondition.

    A false postcondition, not any error: an exception (a mutant out of step with the pool's
    signatures, say) would be reported as a counterexample too, for the wrong reason.
    """
    (tmp_path / f"{module}.py").write_text(source)
    (result,) = _run([[f"{module}.{target}"]], tmp_path)
    errors = _errors(result.stdout)
    assert result.returncode == 1 and any(f": error: false when calling {target}(" in line
                                          for line in errors), result.stdout


@pytest.mark.parametrize("wrapper", ["refused_free_changes_nothing", "touched_blocks_are_not_free"])
def test_broken_pool_is_reported(tmp_path: Path, wrapper: str) -> None:
    """CrossHair finds the counterexample to a contract that a broken pool breaks."""
    source = f"# crosshair: max_iterations={PATHS}\n" + textwrap.dedent(BROKEN)
    _finds("broken_contracts", source, wrapper, tmp_path)


MUTANTS = {
    # touch refused at a foreign block, but the blocks already taken out of
    # the free queue stay out (and keep their extra reference).
    "touch_keeps_partial_effect": "    def _undo_touch(self, *args):\n        pass\n",
    # free_blocks refused at an over-release, but earlier releases stay done.
    "free_keeps_partial_effect": "    def _undo_release(self, *args):\n        pass\n",
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
    """tests/crosshair_contracts.py itself, its directive included, run on a broken BlockPool,
    reports a counterexample: within the budget of paths the real check runs with."""
    original = "from kvpool.impl.pool import BlockPool\n"
    assert original in SOURCE and DIRECTIVE.match(SOURCE)
    broken = ("from kvpool.impl.pool import BlockPool as _Correct\n\n\n"
              "class BlockPool(_Correct):\n" + MUTANTS[mutant])
    _finds("mutant_contracts", SOURCE.replace(original, broken), TARGETS[mutant], tmp_path)


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
    from kvpool.oracle.search.refinement import Shape, model_watcher, replay, requests_for
    from kvpool.verify.phase_refinement import bmc_domain

    shape = Shape(4, 1)
    calls, _, _ = bmc_domain(shape)
    requests = {r.request_id: r for r in requests_for(1)}
    reached = _contracts().REACHED
    assert len(reached) == len(set(map(repr, reached))) and () in reached
    features: set[str] = set()
    for sequence in reached:
        path = [(op, tuple((requests[a] if a in requests else model_watcher(a))
                           if isinstance(a, str) else a for a in args)) for op, args in sequence]
        for done, call in enumerate(sequence):
            before = replay(BlockPool, shape, path[:done]).model
            assert call in [_by_name(c) for c in calls(before)], (sequence, done)
        features |= _features(replay(BlockPool, shape, path).model)  # raises on any divergence
    assert features == set(FEATURES), features

"""Bounded model checking of the executable model (``kvpool bmc``).

The inductive proofs (:mod:`kvpool.proofs.inductive`) are about an
abstraction of the model; this package checks the model itself.  From a
small concrete pool it explores *every* sequence of calls up to a depth,
breadth first, over small finite argument domains (:mod:`.domains`), one
state per class of renamed states (:mod:`.symmetry`), and after every step
checks every model invariant (:data:`kvpool.model.INVARIANTS`) and every step
property (:data:`kvpool.model.properties.STEP_PROPERTIES`): the queue order,
the event log, reuse notices, refusals that change nothing.  A refusal by a
variant that mutates before its check (as an in-place implementation would)
carries the state it left behind as ``error.state``.

Modules: :mod:`.domains` (what is explored), :mod:`.symmetry` (canonical
states), :mod:`.search` (the search), :mod:`.printing` (a violating trace),
:mod:`.actions` (seeded broken actions the search must find).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from kvpool.model import ACTIONS

from .actions import BUG_CONFIG, BUGS, bug_config, find_bug, with_bug
from .domains import TOKENS, WATCHERS, Action, Call, Config, Request, calls, watcher_a, watcher_b
from .printing import describe, format_trace, key_labels, show_arg
from .search import Outcome, Step, apply_call, explore
from .symmetry import canonical, orbit_key, renamings_of

__all__ = [
    "BUGS", "BUG_CONFIG", "TOKENS", "WATCHERS", "Action", "Call", "Config", "Outcome", "Request",
    "Step", "apply_call", "bug_config", "calls", "canonical", "describe", "explore", "find_bug",
    "format_trace", "key_labels", "orbit_key", "renamings_of", "show_arg", "watcher_a", "watcher_b",
    "with_bug",
]



def _as_json(out: Outcome, cfg: Config) -> dict[str, Any]:
    return {
        "depth": out.depth, "states": out.states, "transitions": out.transitions,
        "seconds": round(out.seconds, 3), "complete": out.complete, "ok": out.ok,
        "blocks": cfg.blocks, "events_on": cfg.events_on, "symmetry": cfg.symmetry,
        "violation": out.violation,
        "trace": [{"action": st.action, "args": [show_arg(a) for a in st.args],
                   "changes": describe(st, key_labels(cfg))} for st in out.trace],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Explore; print depth and states, or the violating trace (exit 1)."""
    p = argparse.ArgumentParser(
        prog="kvpool bmc", description=__doc__.split("\n")[0],
        epilog="examples:\n  kvpool bmc --depth 3 --seconds 300\n  kvpool bmc --bug free_same_block_twice",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, default=3, help="maximum number of calls")
    p.add_argument("--seconds", type=float, default=20.0, help="time budget")
    p.add_argument("--blocks", type=int, default=4, help="pool size, null block included")
    p.add_argument("--hash-block-size", type=int, default=1, choices=(1, 2))
    p.add_argument("--no-events", action="store_true", help="a pool with KV events off")
    p.add_argument("--no-symmetry", action="store_true",
                   help="explore renamed states too (no symmetry reduction)")
    p.add_argument("--bug", choices=sorted(BUGS), help="explore with a seeded bug")
    p.add_argument("--json", metavar="FILE", help="also write the outcome as JSON")
    args = p.parse_args(argv)
    cfg = Config(blocks=args.blocks, hash_block_size=args.hash_block_size,
                 events_on=not args.no_events, symmetry=not args.no_symmetry)
    if args.bug:
        cfg = bug_config(args.bug, cfg)
    acts = with_bug(args.bug) if args.bug else ACTIONS
    out = explore(cfg, args.depth, args.seconds, acts)
    if out.violation:
        print(format_trace(out, cfg))
    print(f"bmc: {cfg.blocks} blocks, hbs {cfg.hash_block_size}"
          f"{'' if cfg.events_on else ', events off'}: depth {out.depth} fully explored"
          f"{'' if out.complete else ' (budget or violation stopped the next level)'}, "
          f"{out.states} states{' up to renaming' if cfg.symmetry else ''}, "
          f"{out.transitions} transitions, {out.seconds:.2f}s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_as_json(out, cfg), fh, indent=2)
    return 1 if out.violation else 0


if __name__ == "__main__":
    sys.exit(main())


"""``kvpool bmc``: bounded model checking of the executable model, from the command line.

The search is :mod:`kvpool.proofs.bmc`'s; this prints the depth and states
reached, or the violating trace (exit 1), and writes the outcome as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.bugs import BUGS
from kvpool.bugs.check import bmc_config, with_bug
from kvpool.model import ACTIONS
from kvpool.proofs import bmc
from kvpool.shard import Shard, ShardError
from kvpool.verify.phases import part_json

from .usage import command_parser, write_json

WITH_ACTION_FORM = sorted(name for name, bug in BUGS.items() if bug.action is not None)
"""The seeded bugs ``--bug`` can explore: those with a broken model action."""


def outcome_json(out: bmc.Outcome, cfg: bmc.Bounds) -> dict[str, Any]:
    """The ``--json`` document: the figures of the search and the violating trace, if any."""
    labels = bmc.key_labels(cfg)
    return {
        "depth": out.depth, "states": out.states, "transitions": out.transitions,
        "seconds": round(out.seconds, 3), "complete": out.complete, "ok": out.ok,
        "expanded": out.expanded, "frontier": out.frontier,
        "part": None if out.part is None else part_json(out.part),
        "blocks": cfg.blocks, "events_on": cfg.events_on, "symmetry": cfg.symmetry,
        "violation": out.violation,
        "trace": [{"action": st.action, "args": [bmc.show_arg(a) for a in st.args],
                   "changes": bmc.describe(st, labels)} for st in out.trace],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Explore; print depth and states, or the violating trace (exit 1)."""
    p = command_parser("kvpool bmc", "Bounded model checking of the executable model (``kvpool bmc``).",
                       "examples:\n  kvpool bmc --depth 3 --seconds 300\n"
                       "  kvpool bmc --bug free_same_block_twice")
    p.add_argument("--depth", type=int, default=3, help="maximum number of calls")
    p.add_argument("--seconds", type=float, default=20.0, help="time budget")
    p.add_argument("--blocks", type=int, default=4, help="pool size, null block included")
    p.add_argument("--hash-block-size", type=int, default=1, choices=(1, 2))
    p.add_argument("--no-events", action="store_true", help="a pool with KV events off")
    p.add_argument("--no-symmetry", action="store_true",
                   help="explore renamed states too (no symmetry reduction)")
    p.add_argument("--bug", choices=WITH_ACTION_FORM, metavar="BUG",
                   help="explore with a seeded bug of kvpool.bugs (one with a broken model action)")
    p.add_argument("--shard", metavar="I/N",
                   help="explore part I of N: every level to --split-depth, then every N-th state of it")
    p.add_argument("--split-depth", type=int, default=2, metavar="K", help="where --shard splits (2)")
    p.add_argument("--json", metavar="FILE", help="also write the outcome as JSON")
    args = p.parse_args(argv)
    try:
        part = None if args.shard is None else Shard.parse(args.shard).part
    except ShardError as exc:
        p.error(f"--shard {exc}")
    cfg = bmc.Bounds(blocks=args.blocks, hash_block_size=args.hash_block_size,
                     events_on=not args.no_events, symmetry=not args.no_symmetry)
    if args.bug:
        cfg = bmc_config(BUGS[args.bug], cfg)
    acts = with_bug(args.bug) if args.bug else ACTIONS
    out = bmc.explore(cfg, args.depth, args.seconds, acts, part=part, split_depth=args.split_depth)
    if out.violation:
        print(bmc.format_trace(out, cfg))
    print(f"bmc: {cfg.blocks} blocks, hbs {cfg.hash_block_size}"
          f"{'' if cfg.events_on else ', events off'}: depth {out.depth} fully explored"
          f"{'' if out.complete else ' (budget or violation stopped the next level)'}, "
          f"{out.states} states{' up to renaming' if cfg.symmetry else ''}, "
          f"{out.transitions} transitions, {out.seconds:.2f}s")
    if not out.complete and not out.violation:
        print(f"  level {out.depth + 1}: calls made from {out.expanded:,} of the {out.frontier:,} states "
              f"at depth {out.depth}")
    if out.part is not None:
        print(f"  part {args.shard}: {out.part.owned:,} of the {out.part.frontier:,} states at depth "
              f"{out.part.split_depth}; {len(out.part.beyond):,} states beyond it")
    if args.json:
        write_json(args.json, outcome_json(out, cfg))
    return 1 if out.violation else 0


__all__ = ["main", "outcome_json"]

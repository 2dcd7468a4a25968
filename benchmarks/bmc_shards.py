"""How a sharded BMC divides its work: each part's transitions against one unsharded search.

``python benchmarks/bmc_shards.py --blocks 4 --hbs 2 --depth 3 --shards 2 4 8 32`` explores
the whole search once, then every part of each split (one after the other, in this process),
and prints per split: the largest part's transitions (what bounds a runner's time), the
parts' sum (the work the runners do together, duplicates included), the speed-up
``whole / largest``, and the states the parts keep between them (a state reached by two
parts counted twice).  The merged states and transitions must equal the whole search's.
"""

from __future__ import annotations

import argparse
import time

from kvpool.proofs import bmc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--hbs", type=int, default=2)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--split-depth", type=int, default=2)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8, 32])
    args = p.parse_args()
    cfg = bmc.Bounds(blocks=args.blocks, hash_block_size=args.hbs)
    began = time.process_time()
    whole = bmc.explore(cfg, args.depth, 1e9)
    cpu = time.process_time() - began
    print(f"{args.blocks} blocks, hbs {args.hbs}, depth {args.depth}: {whole.states:,} states, "
          f"{whole.transitions:,} transitions, {cpu:.1f} s CPU unsharded")
    print("shards | largest part (transitions) | parts together | speed-up | states in the parts "
          "| merged = whole")
    for n in args.shards:
        parts = [bmc.explore(cfg, args.depth, 1e9, part=(i, n), split_depth=args.split_depth)
                 for i in range(n)]
        largest = max(q.transitions for q in parts)
        together = sum(q.transitions for q in parts)
        merged = bmc.merge_parts([q.part for q in parts if q.part is not None])
        print(f"{n:6} | {largest:26,} | {together:14,} | {whole.transitions / largest:8.1f} | "
              f"{sum(q.states for q in parts):19,} | {merged == (whole.states, whole.transitions)}")


if __name__ == "__main__":
    main()

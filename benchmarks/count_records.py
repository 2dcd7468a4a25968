"""A stand-in for the shadow's checker process that only counts what it is sent.

    (started by benchmarks/replay_trace.py in place of ``python -m kvpool.oracle.shadow.child``)

With it the engine's side of the shadow does all its work (each call recorded, pickled and
written to the pipe, the whole pool read every ``num_blocks`` calls) while the other core stays
nearly idle: the engine's CPU then is the recording's own cost, apart from what sharing the
machine with a busy checker adds.
"""

from __future__ import annotations

import sys
import time

from kvpool.oracle.shadow.hub import read_records, write_frame


def main() -> int:
    src, out = sys.stdin.buffer, sys.stdout.buffer
    calls = 0
    while (batch := read_records(src)) is not None:
        for message in batch:
            if message[0] == "call":
                calls += 1
            elif message[0] == "same":
                calls += len(message[2])
            elif message[0] == "sync":
                write_frame(out, {"stopped": [], "totals": {"calls": calls, "cpu": time.process_time()}})
    write_frame(out, {"stopped": [], "totals": {"calls": calls, "cpu": time.process_time()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

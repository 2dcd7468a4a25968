"""The checker process: ``python -m kvpool.oracle.shadow.child``, started by the engine's hub.

It reads the engine's records from stdin (batches of pickled records, :mod:`.hub`) and
checks them (:mod:`.check`); a ``sync`` record is answered on stdout with the
totals so far and the pools whose check ended, and at the end of stdin (the
engine finished, or died) it closes every working file and answers with its
final totals.  Its log lines go to stderr, the engine's.
"""

from __future__ import annotations

import logging
import sys

from .check import Checker, pid_totals
from .hub import read_records, write_frame


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        return _serve()
    except (BrokenPipeError, ConnectionError):  # the engine went without reading the totals
        return 0


def _serve() -> int:
    src, out = sys.stdin.buffer, sys.stdout.buffer
    checker = Checker()
    stopped: list[int] = []
    checker.on_stop = stopped.append
    while True:
        batch = read_records(src)
        if batch is None:
            break
        for message in batch:
            if message[0] == "sync":
                write_frame(out, {"stopped": list(stopped), "totals": pid_totals()})
                stopped.clear()
            else:
                try:
                    checker.handle(message)
                except Exception as exc:  # the checker's own failure: that pool's check ends
                    number = message[1] if len(message) > 1 and isinstance(message[1], int) else None
                    found = checker.pools.get(number) if number is not None else None
                    if found is None:
                        raise
                    found.stop(f"the checker failed: {exc!r}")
    checker.close_all()
    write_frame(out, {"stopped": stopped, "totals": pid_totals()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

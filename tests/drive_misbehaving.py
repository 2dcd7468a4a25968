"""A pool process that misbehaves on purpose, for ``tests/test_drive.py``.

It answers as kvpool's own pool does (``kvpool.oracle.drive.serve``) until
call ``--at N`` of a pool (counted from each header, so the process is as
deterministic as a real one), or until line ``--line N`` of its input (counted
from its start: a process that fails at a position, whatever the calls), then
does what ``MODE`` says.  ``--pids FILE`` writes its pid (and a child's, for
``spawn``) so that the test can check that nothing outlives kvpool; ``--log
FILE`` appends each header's pool, one JSON line each, so that a test can see
which pools it was asked for; ``--lacks NAMES`` declares them in its header
answers; ``--record FILE`` appends every line of its input as it came.

    python tests/drive_misbehaving.py MODE [--at N | --line N] [--pids FILE] [--log FILE] [--record FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from kvpool.impl import BlockPool
from kvpool.oracle.drive import protocol
from kvpool.oracle.drive.serve import Server

MODES = ("crash", "hang", "garbage", "version", "extra", "log", "linger", "spawn", "refuse", "wrong",
         "null-events", "deny", "well")
"""``well`` never misbehaves (with ``--log``: a recording pool)."""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--at", type=int, default=5, help="the call that misbehaves (from 1, per pool)")
    parser.add_argument("--line", type=int, default=0,
                        help="misbehave at this line of the input instead (from 1, since the start)")
    parser.add_argument("--pids", help="write this process's pid (and its child's) here")
    parser.add_argument("--log", help="append each header's pool here")
    parser.add_argument("--lacks", default="", help="declare these names lacking")
    parser.add_argument("--record", help="append every input line here")
    parser.add_argument("--observe", action="store_true", help="answer with observations (no batches)")
    args = parser.parse_args()
    pids = [str(os.getpid())]
    if args.mode == "spawn":  # a grandchild that would outlive a careless parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pids.append(str(child.pid))
    if args.pids:
        with open(args.pids, "w") as out:
            out.write(" ".join(pids))
    if args.mode == "log":
        print("INFO pool starting", flush=True)  # logging on stdout: not an answer
    server = Server(BlockPool, observe=args.observe, lacks=args.lacks.replace(",", " ").split())
    calls = lines = 0
    out = sys.stdout.buffer
    record = open(args.record, "ab", buffering=0) if args.record else None  # noqa: SIM115 (the whole run)
    for raw in sys.stdin.buffer:
        lines += 1
        if record is not None:
            record.write(raw)
        value = protocol.decode(raw)
        header = isinstance(value, dict) and protocol.KEY in value
        if header and args.log:
            with open(args.log, "a") as log:
                log.write(json.dumps(value.get("pool")) + "\n")
        if header and args.mode == "version":
            out.write(protocol.encode({"kvpool_drive": 2, "ok": True}))
            out.flush()
            continue
        if header and args.mode == "refuse":
            out.write(protocol.encode({"ok": False, "error": "no pools today"}))
            out.flush()
            continue
        answer = server.answer(raw)
        calls = 0 if header else calls + 1
        due = lines == args.line if args.line else calls == args.at and not header
        if due and args.mode != "well":
            print(f"misbehaving at {'line ' + str(lines) if args.line else 'call ' + str(calls)} as asked: "
                  f"{args.mode}", file=sys.stderr, flush=True)
            if args.mode == "crash":
                print("thread 'main' panicked at src/pool.rs:42:7: index out of bounds",
                      file=sys.stderr, flush=True)
                return 101
            if args.mode in ("hang", "spawn"):
                time.sleep(600)
            if args.mode == "garbage":
                out.write(b"{\"result\": [1, 2\n")
                out.flush()
                continue
            if args.mode == "extra":
                out.write(protocol.encode(answer))
            if args.mode == "null-events" and "events" in answer:
                answer["events"] = None
            if args.mode == "deny":  # a refusal the model does not make, saying why
                answer.update(result=None, error="InvalidArgumentError", message="no calls on Tuesdays")
        result = answer.get("result")
        if args.mode == "wrong" and calls >= args.at and type(result) is int:  # no protocol fault
            answer["result"] = result + 1
        out.write(protocol.encode(answer))
        out.flush()
    if args.mode == "linger":
        time.sleep(600)  # does not exit at the end of stdin
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

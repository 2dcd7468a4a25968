"""A Python pool behind the drive protocol: the reference client (``python -m kvpool.oracle.drive.serve``).

By default kvpool's own pool, which agrees with the model: run it and your
process on the same input and compare the answers line by line
(``oracle/DRIVE_PROTOCOL.md``).  ``--pool MODULE:CLASS`` serves any pool class
with the reference API (``--pool`` modules are found from the current
directory), ``--observe`` adds the whole pool after every call, as a trace's
``observation``.

It reads stdin to its end, one call per line, answers each on stdout, and
writes nothing else there (complaints go to stderr).  A line it cannot read
gets an answer with ``error`` ``ProtocolViolation``, so the other side sees
where.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO, Any

from kvpool.model import OPERATIONS
from kvpool.model.operations import Translate
from kvpool.model.request import prefix_key

from ..core.abstraction import concrete_key
from ..core.adapter import LoadError, lacking, load_object
from ..core.observe import Observer
from ..trace.read import Header, TraceStep, json_lines, parse_header
from ..trace.schema import FieldError, Json, TraceError
from ..trace.write import encode_result, event_to_json, observation_to_json
from . import protocol


class _Named:
    """A reuse watcher known by its name; records what it is told during one call."""

    def __init__(self, name: str, log: list[list[Json]]) -> None:
        self.name, self.log = name, log

    def __call__(self, block: Any) -> None:
        self.log.append([self.name, block.block_id])


class _Stranger:
    """Stands for a block id outside the pool, when the pool's block class cannot be built."""

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_cnt, self.block_hash, self.is_null = block_id, 0, None, False


class Server(Translate):
    """One pool at a time, made by each header, called by each call line."""

    def __init__(self, pool_class: Any, observe: bool) -> None:
        self.pool_class, self.observe = pool_class, observe
        self.pool: Any = None
        self.header: Header | None = None
        self.fired: list[list[Json]] = []
        self.watchers: dict[str, _Named] = {}
        self.pending: list[Json] = []
        """Events not yet taken, for a pool without ``kv_event_queue`` (taken after each call)."""
        self.lines = 0

    # --------------------------------------------------------------- lines

    def answer(self, raw: bytes) -> dict[str, Json]:
        self.lines += 1
        try:
            value = protocol.decode(raw)
            if isinstance(value, dict) and protocol.KEY in value:
                return self._open(protocol.read_pool(value))
            if self.header is None:
                raise protocol.ProtocolError("garbage", "a call before any header")
            return self._call(protocol.read_call(value, self.header, self.lines))
        except protocol.ProtocolError as exc:
            if exc.kind == "version":
                return {"ok": False, "error": exc.what}
            print(f"serve: line {self.lines}: {exc.what}", file=sys.stderr)
            return {"result": None, "error": "ProtocolViolation", "events": [], "fired": []}

    def _open(self, header: Header) -> dict[str, Json]:
        extra = {} if header.medium == "GPU" else {"medium": header.medium}
        try:
            pool = self.pool_class(header.num_blocks, header.enable_caching, header.hash_block_size,
                                   enable_kv_cache_events=header.enable_kv_cache_events, **extra)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.pool, self.header = pool, header
        self.watchers, self.pending = {}, []
        answer: dict[str, Json] = {"kvpool_drive": protocol.VERSION, "ok": True}
        lacks = lacking(pool)
        if lacks:
            answer["unsupported"] = lacks
        if self.observe:
            answer["observation"] = self._observation()
        return answer

    def _observation(self) -> dict[str, Json]:
        return observation_to_json(Observer(self.pool).observe())

    # --------------------------------------------------------------- calls

    def block(self, block_id: Any) -> Any:
        blocks = self.pool.blocks
        if isinstance(block_id, int) and 0 <= block_id < len(blocks):
            return blocks[block_id]
        try:
            return type(blocks[0])(block_id)
        except Exception:
            return _Stranger(block_id)

    def key(self, request: Any, prefix_tokens: Any, group: int) -> bytes:
        """The key ``_insert_block_hash`` receives: the one the request names (b"" for none)."""
        hbs = self.pool.hash_block_size
        ok = 0 < prefix_tokens <= hbs * len(request.block_hashes) and not prefix_tokens % hbs
        return concrete_key(prefix_key(request, prefix_tokens, hbs, group)) if ok else b""

    def _args(self, step: TraceStep) -> list[Any]:
        """The trace's arguments as the pool takes them (blocks for ids, callables for names),
        as the operation's declaration says."""
        decl = OPERATIONS[step.op]
        values = [step.args[a.name] for a in decl.args if a.name in step.args]
        if step.op == "unpin_blocks":
            name = str(values[1])
            values[1] = self.watchers.setdefault(name, _Named(name, self.fired))
        return list(decl.pool_args(values, self))

    def _call(self, step: TraceStep) -> dict[str, Json]:
        pool, op = self.pool, step.op
        queue: Any = getattr(pool, "kv_event_queue", None)
        shown = isinstance(queue, list)
        before = len(queue) if shown else 0
        self.fired.clear()
        error, result = None, None
        try:
            if op == "take_events" and not shown:  # what this side kept, and anything left
                result, self.pending = [*self.pending, *map(event_to_json, pool.take_events())], []
            else:
                result = encode_result(op, getattr(pool, op)(*self._args(step)))
        except Exception as exc:
            error, result = type(exc).__name__, None
        if op == "take_events":
            events: list[Json] = []
        elif shown:
            events = [event_to_json(e) for e in queue[before:]]
        else:  # no queue to look at: take the events after each call, and keep them here
            events = [event_to_json(e) for e in pool.take_events()]
            self.pending += events
        answer: dict[str, Json] = {"result": result, "error": error, "events": events,
                                   "fired": list(self.fired)}
        if self.observe:
            answer["observation"] = self._observation()
        return answer


def serve(pool_class: Any, observe: bool, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """Answer every line of ``stdin`` on ``stdout``; 0 at the end of input."""
    server = Server(pool_class, observe)
    for raw in stdin:
        if not raw.strip():
            continue
        stdout.write(protocol.encode(server.answer(raw)))
        stdout.flush()
    return 0


def input_of(path: str, stdout: IO[bytes]) -> int:
    """What a pool process reads for a trace: its header as a drive header, then each call's
    ``op`` and ``args``.  0, or 2 (one line on stderr) for a file that is not a trace."""
    try:
        lines = [value for _number, value in json_lines(path)]
        header = parse_header(lines[0]) if lines else None
    except (TraceError, FieldError) as exc:
        print(f"serve: {path}: {exc}", file=sys.stderr)
        return 2
    if header is None:
        print(f"serve: {path}: empty file", file=sys.stderr)
        return 2
    pool = {k: v for k, v in lines[0].items() if k not in ("kvpool_trace", "meta", "vllm_errors")}
    stdout.write(protocol.encode(protocol.header(pool)))
    for value in lines[1:]:
        if isinstance(value, dict):
            stdout.write(protocol.encode({"op": value.get("op"), "args": value.get("args")}))
    stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvpool serve-pool",
        description="Serve a Python block pool over the drive protocol (oracle/DRIVE_PROTOCOL.md) "
                    "on stdin/stdout: kvpool's own pool by default, which agrees with the model. "
                    "Also python -m kvpool.oracle.drive.serve.",
        epilog="compare a process with it, line for line, on the calls of a trace:\n"
               "  kvpool serve-pool --input-of t.jsonl > in.jsonl\n"
               "  kvpool serve-pool < in.jsonl > kvpool.out; ./my-pool < in.jsonl > mine.out\n"
               "  diff <(python -m json.tool --json-lines --compact --sort-keys kvpool.out) \\\n"
               "       <(python -m json.tool --json-lines --compact --sort-keys mine.out)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", default="kvpool.impl:BlockPool", metavar="MODULE:CLASS",
                        help="the pool class to serve (default kvpool.impl:BlockPool)")
    parser.add_argument("--observe", action="store_true",
                        help="answer every call with the whole pool (the trace's observation)")
    parser.add_argument("--input-of", metavar="TRACE",
                        help="serve nothing: print the lines a pool process reads for this trace")
    args = parser.parse_args(argv)
    if args.input_of is not None:
        return input_of(args.input_of, sys.stdout.buffer)
    try:
        pool_class = load_object(args.pool)
    except LoadError as exc:
        print(f"serve: --pool {exc}", file=sys.stderr)
        return 2
    return serve(pool_class, args.observe, sys.stdin.buffer, sys.stdout.buffer)


__all__ = ["Server", "input_of", "main", "serve"]


if __name__ == "__main__":
    raise SystemExit(main())

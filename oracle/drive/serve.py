"""A Python pool behind the drive protocol: the reference client (``python -m kvpool.oracle.drive.serve``).

By default kvpool's own pool, which agrees with the model: run it and your
process on the same input and compare the answers (``--join`` makes a trace of
a process's answers that ``kvpool check-trace`` checks; ``oracle/DRIVE_PROTOCOL.md``).
``--pool MODULE:CLASS`` serves any pool class with the reference API (``--pool``
modules are found from the current directory), ``--observe`` adds the whole
pool after every call, as a trace's ``observation``; ``--lacks NAMES`` (or the
class's ``kvpool_lacks``) declares what the pool lacks.  It answers ``observe``
lines, reports a metrics collector's calls when a header asks for one (and the
class takes ``metrics_collector``), and says why it refused a call
(``message``).

It reads stdin to its end, one call per line, answers each on stdout, and
writes nothing else there (complaints go to stderr).  A line it cannot read
gets an answer with ``error`` ``ProtocolViolation``, so the other side sees
where.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from kvpool.model import OPERATIONS
from kvpool.model.operations import Translate
from kvpool.model.request import prefix_key

from ..core.abstraction import concrete_key
from ..core.adapter import LoadError, lacking, load_object
from ..core.lockstep import Foreign
from ..core.observe import Observer, accepts
from ..generate.capabilities import parse_lacks
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


class _Told:
    """A metrics collector that writes down what it is told, as ``told`` names it."""

    def __init__(self) -> None:
        self.log: list[list[Json]] = []

    def on_block_allocated(self, block: Any) -> None:
        self.log.append(["allocated", block.block_id])

    def on_block_accessed(self, block: Any) -> None:
        self.log.append(["accessed", block.block_id])

    def on_block_evicted(self, block: Any) -> None:
        self.log.append(["evicted", block.block_id])

    def reset(self) -> None:
        self.log.append(["reset", None])


class Server(Translate):
    """One pool at a time, made by each header, called by each call line."""

    def __init__(self, pool_class: Any, observe: bool, lacks: Sequence[str] = ()) -> None:
        self.pool_class, self.observe = pool_class, observe
        self.lacks = [*lacks, *(n for n in getattr(pool_class, "kvpool_lacks", ()) if n not in lacks)]
        self.pool: Any = None
        self.header: Header | None = None
        self.fired: list[list[Json]] = []
        self.watchers: dict[str, _Named] = {}
        self.pending: list[Json] = []
        """Events not yet taken, for a pool without ``kv_event_queue`` (taken after each call)."""
        self.told: _Told | None = None
        """The metrics collector the pool was made with, when the header asked for one."""
        self.when_asked = False
        """The pool is shown only where a line asks (the header asked, and the pool is observed)."""
        self.lines = 0

    # --------------------------------------------------------------- lines

    def answer(self, raw: bytes) -> dict[str, Json]:
        self.lines += 1
        try:
            value = protocol.decode(raw)
            if isinstance(value, dict) and protocol.KEY in value:
                pool = value.get("pool")
                asks = pool if isinstance(pool, dict) else {}
                return self._open(protocol.read_pool(value), asks.get("metrics_collector") is True,
                                  asks.get("show_when_asked") is True)
            if self.header is None:
                raise protocol.ProtocolError("garbage", "a call before any header")
            if isinstance(value, dict) and value.get("op") == protocol.OBSERVE:
                return self._observe(*protocol.read_observe_args(value.get("args")))
            asked = isinstance(value, dict) and value.get("show") is True
            answer = self._call(protocol.read_call(value, self.lines), asked)
            if isinstance(value, dict) and value.get("observe") is not None:  # asked with the call
                answer["observed"] = self._observe(*protocol.read_observe_args(value["observe"]))["result"]
            return answer
        except protocol.ProtocolError as exc:
            if exc.kind == "version":
                return {"ok": False, "error": exc.what}
            print(f"serve: line {self.lines}: {exc.what}", file=sys.stderr)
            return {"result": None, "error": "ProtocolViolation", "events": [], "fired": []}

    def _open(self, header: Header, metrics: bool = False,
              header_asks_shown: bool = False) -> dict[str, Json]:
        extra: dict[str, Any] = {} if header.medium == "GPU" else {"medium": header.medium}
        collector = metrics and "metrics" not in self.lacks and accepts(self.pool_class, "metrics_collector")
        told = _Told() if collector else None
        if told is not None:
            extra["metrics_collector"] = told
        try:
            pool = self.pool_class(header.num_blocks, header.enable_caching, header.hash_block_size,
                                   enable_kv_cache_events=header.enable_kv_cache_events, **extra)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.pool, self.header, self.told = pool, header, told
        self.watchers, self.pending = {}, []
        answer: dict[str, Json] = {"kvpool_drive": protocol.VERSION, "ok": True, "observe": True}
        self.when_asked = self.observe and bool(header_asks_shown)
        if self.when_asked:
            answer["show_when_asked"] = True
        if told is not None:
            answer["metrics"] = True
        lacks = lacking(pool)
        if lacks:
            answer["unsupported"] = lacks
        if self.lacks:
            answer["lacks"] = list(self.lacks)
        if self.observe:
            answer["observation"] = self._observation()
        return answer

    def _observe(self, blocks: list[int], keys: list[tuple[bytes, int]]) -> dict[str, Json]:
        """An observe line: the free count, each block's writability, each key's lookup."""
        pool = self.pool
        cached = [hit[0].block_id if (hit := pool.get_cached_block(h, [g])) else None for h, g in keys]
        result: dict[str, Json] = {"num_free": pool.get_num_free_blocks(),
                                   "writable": [bool(pool.is_block_writable(self.block(b))) for b in blocks],
                                   "cached": cached}
        if self.when_asked:  # the named blocks' and keys' entries of the whole pool
            whole = self._observation()
            shown: dict[str, Json] = {name: [whole[name][b] for b in blocks]
                                      for name in ("ref", "primary", "secondary") if name in whole}
            if "watched" in whole:
                shown["watched"] = [b in whole["watched"] for b in blocks]
            if "index" in whole:
                index = dict((k, ids) for k, ids in whole["index"])
                shown["index"] = [index.get(concrete_key(k).hex(), []) for k in keys]
            result["shown"] = shown
        return {"result": result, "error": None, "events": []}

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
            return Foreign(block_id)

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

    def _call(self, step: TraceStep, show: bool = False) -> dict[str, Json]:
        pool, op = self.pool, step.op
        queue: Any = getattr(pool, "kv_event_queue", None)
        shown = isinstance(queue, list)
        before = len(queue) if shown else 0
        self.fired.clear()
        if self.told is not None:
            self.told.log.clear()
        error, result, message = None, None, None
        try:
            if op == "take_events" and not shown:  # what this side kept, and anything left
                result, self.pending = [*self.pending, *map(event_to_json, pool.take_events())], []
            else:
                result = encode_result(op, getattr(pool, op)(*self._args(step)))
        except Exception as exc:
            error, result, message = type(exc).__name__, None, str(exc)
        if op == "take_events":
            events: list[Json] = []
        elif shown:
            events = [event_to_json(e) for e in queue[before:]]
        else:  # no queue to look at: take the events after each call, and keep them here
            events = [event_to_json(e) for e in pool.take_events()]
            self.pending += events
        answer: dict[str, Json] = {"result": result, "error": error, "events": events,
                                   "fired": list(self.fired)}
        if message:
            answer["message"] = message
        if self.told is not None:
            answer["told"] = list(self.told.log)
        if self.observe and (show or not self.when_asked):
            answer["observation"] = self._observation()
        return answer


def serve(pool_class: Any, observe: bool, stdin: IO[bytes], stdout: IO[bytes],
          lacks: Sequence[str] = ()) -> int:
    """Answer every line of ``stdin`` on ``stdout``; 0 at the end of input."""
    server = Server(pool_class, observe, lacks)
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


def join(calls: str, answers: str, stdout: IO[str]) -> int:
    """A trace of a process's answers to the lines it read: each call line with its answer (an
    observe line as the queries it stands for), under the trace header of the drive header, for
    ``kvpool check-trace``.  0, or 2 (one line on stderr) for files that do not pair up."""
    try:
        sent = [value for _n, value in json_lines(calls)]
        got = [value for _n, value in json_lines(answers)]
    except (TraceError, FieldError) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    if len(sent) != len(got) or not sent or not isinstance(sent[0], dict) or protocol.KEY not in sent[0]:
        print(f"serve: {calls} and {answers} do not pair up: {len(sent)} lines sent (the first a "
              f"header), {len(got)} answered", file=sys.stderr)
        return 2
    out: list[Json] = [protocol.trace_header(dict(sent[0].get("pool") or {}))]
    for number, (call, answer) in enumerate(zip(sent[1:], got[1:], strict=True), start=2):
        if not (isinstance(call, dict) and isinstance(answer, dict)) or protocol.KEY in call:
            print(f"serve: line {number}: one pool per trace; a call and its answer", file=sys.stderr)
            return 2
        observe = call.get("op") == protocol.OBSERVE
        if not observe:
            line = {"op": call.get("op"), "args": call.get("args"),
                    **{k: answer[k] for k in protocol.ANSWER_FIELDS if k in answer}}
            line.setdefault("fired", [])
            out.append(line)
        if observe or call.get("observe") is not None:  # or questions asked with the call, answered after it
            blocks, keys = protocol.read_observe_args(call.get("args") if observe else call["observe"])
            read = protocol.read_observed if observe else protocol.read_observed_field
            out += protocol.observe_queries(blocks, [[h.hex(), g] for h, g in keys],
                                            read(answer, len(blocks), len(keys)))
    for value in out:
        stdout.write(json.dumps(value, separators=(",", ":")) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvpool serve-pool",
        description="Serve a Python block pool over the drive protocol (oracle/DRIVE_PROTOCOL.md) "
                    "on stdin/stdout: kvpool's own pool by default, which agrees with the model. "
                    "Also python -m kvpool.oracle.drive.serve.",
        epilog="check a process's answers to the calls of a trace:\n"
               "  kvpool serve-pool --input-of t.jsonl > in.jsonl\n"
               "  ./my-pool < in.jsonl > mine.out\n"
               "  kvpool serve-pool --join in.jsonl mine.out > mine.jsonl\n"
               "  kvpool check-trace mine.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", default="kvpool.impl:BlockPool", metavar="MODULE:CLASS",
                        help="the pool class to serve (default kvpool.impl:BlockPool)")
    parser.add_argument("--observe", action="store_true",
                        help="answer every call with the whole pool (the trace's observation)")
    parser.add_argument("--lacks", metavar="NAMES", default="",
                        help="declare what the pool lacks (operations, features, shapes; commas or "
                             "spaces), as the header's answer says it")
    parser.add_argument("--input-of", metavar="TRACE",
                        help="serve nothing: print the lines a pool process reads for this trace")
    parser.add_argument("--join", nargs=2, metavar=("LINES", "ANSWERS"),
                        help="serve nothing: the trace of a process's ANSWERS to the LINES it read "
                             "(for kvpool check-trace)")
    args = parser.parse_args(argv)
    if args.input_of is not None:
        return input_of(args.input_of, sys.stdout.buffer)
    if args.join is not None:
        try:
            return join(args.join[0], args.join[1], sys.stdout)
        except protocol.ProtocolError as exc:
            print(f"serve: {exc.what}", file=sys.stderr)
            return 2
    try:
        lacks = parse_lacks(args.lacks)
        pool_class = load_object(args.pool)
    except (LoadError, ValueError) as exc:
        print(f"serve: {'--pool' if isinstance(exc, LoadError) else '--lacks'} {exc}", file=sys.stderr)
        return 2
    return serve(pool_class, args.observe, sys.stdin.buffer, sys.stdout.buffer,
                 sorted(lacks))


__all__ = ["Server", "input_of", "join", "main", "serve"]


if __name__ == "__main__":
    raise SystemExit(main())

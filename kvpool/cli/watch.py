"""``kvpool watch``: the KV events a vLLM fleet publishes, checked as they come.

The checking is :mod:`kvpool.oracle.events` (the same rules and router
profiles as ``check-events``, fed event by event); the sockets are
:mod:`kvpool.oracle.events.subscribe`.  This is the command line: endpoints
and options in, findings out as JSON lines, a summary line now and then, and
Prometheus metrics on request.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

from .events import block_sizes_arg, router_name
from .usage import command_parser, fail

LIVE_DEPENDENCIES = ("zmq", "msgspec")
"""The extra ``kvpool[live]``: what the watcher and the wire decoder need."""


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "kvpool watch",
        "Subscribe to vLLM KV-event publishers (ZmqEventPublisher) and check each engine's "
        "stream as it comes, with check-events' rules and router profiles. Findings go out as JSON lines.",
        "examples:\n  kvpool watch tcp://engine-1:5557 tcp://engine-2:5557 "
        "--replay tcp://engine-1:5558 --replay tcp://engine-2:5558\n"
        "  kvpool watch tcp://*:5557 --bind --dp-ranks 4 --router dynamo --router llm-d --metrics-port 9400\n"
        "  kvpool watch tcp://engine:5557 --record incident.kvwire   # then: kvpool check-events "
        "incident.kvwire\n"
        "exit: 0 no violation, 1 violations (or, with --strict, warnings or router reactions), 2 usage")
    parser.add_argument("endpoints", nargs="+", metavar="ENDPOINT",
                        help="a publisher's endpoint (tcp://host:port), as vLLM's kv_events_config names it")
    parser.add_argument("--replay", action="append", default=[], metavar="ENDPOINT",
                        help="the replay (ROUTER) endpoint of each ENDPOINT, in the same order (one for "
                             "all when there is one ENDPOINT); missed batches are asked of it")
    parser.add_argument("--topic", default="", help="the topic to subscribe to (a prefix; default all)")
    parser.add_argument("--bind", action="store_true",
                        help="bind the endpoints and let the publishers connect (vLLM endpoints without "
                             "'*'); engines on one endpoint are told apart by topic")
    parser.add_argument("--dp-ranks", type=int, default=1, metavar="N",
                        help="each endpoint serves data-parallel ranks 0..N-1, rank r on the port plus r "
                             "(and its replay endpoint likewise), as vLLM offsets them")
    parser.add_argument("--router", type=router_name, action="append", default=[], metavar="NAME",
                        help="also read each stream as this router does (repeatable; docs/routers.md)")
    parser.add_argument("--block-sizes", type=block_sizes_arg, default=None, metavar="G=N[,G=N]",
                        help="full block size per KV-cache group (else learned from the stream)")
    parser.add_argument("--output", default="-", metavar="FILE",
                        help="where the findings go, one JSON object a line (default stdout)")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="write every message received to FILE (oracle/WIRE_FORMAT.md), for "
                             "kvpool check-events FILE to replay")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (0: any free port)")
    parser.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST")
    parser.add_argument("--summary-every", type=float, default=10.0, metavar="SECONDS",
                        help="print a one-line summary to stderr this often (0: only at the end)")
    parser.add_argument("--give-up", type=float, default=10.0, metavar="SECONDS",
                        help="stop waiting for missed batches after this long (they are then lost)")
    parser.add_argument("--history", type=int, default=None, metavar="N",
                        help="removed and possibly phantom keys remembered per engine (default 65536)")
    parser.add_argument("--max-batches", type=int, default=None, metavar="N",
                        help="stop after N batches (all engines)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="stop after this long")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 on warnings and router reactions too")
    return parser


def _sources(args: argparse.Namespace) -> list[Any]:
    # the extra kvpool[live] (msgspec, pyzmq): imported once main() has checked it is there
    from kvpool.oracle.events.capture import Source
    from kvpool.oracle.events.wire import rank_endpoint

    replays: list[str | None] = list(args.replay)
    if len(replays) == 1 and len(args.endpoints) > 1:
        raise ValueError("--replay: give one per ENDPOINT, in the same order")
    if replays and len(replays) != len(args.endpoints):
        raise ValueError(f"--replay given {len(replays)} time(s) for {len(args.endpoints)} endpoint(s)")
    replays += [None] * (len(args.endpoints) - len(replays))
    if args.dp_ranks < 1:
        raise ValueError("--dp-ranks must be at least 1")
    return [Source(rank_endpoint(e, r), None if p is None else rank_endpoint(p, r), r)
            for e, p in zip(args.endpoints, replays, strict=True) for r in range(args.dp_ranks)]


def _serve_metrics(fleet: Any, host: str, port: int) -> ThreadingHTTPServer:
    from kvpool.oracle.events.metrics import render  # kvpool[live], as _sources says

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = render(fleet).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="kvpool-metrics", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """``kvpool watch``; the exit code."""
    args = _parser().parse_args(argv)
    # the extra kvpool[live]: without it, a usage error naming it rather than a traceback
    try:
        from kvpool.oracle.events.capture import CaptureWriter, Header
        from kvpool.oracle.events.fleet import GC_THRESHOLDS, Fleet, Report
        from kvpool.oracle.events.online import HISTORY
        from kvpool.oracle.events.routers import profile_factory
        from kvpool.oracle.events.subscribe import Watcher
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in LIVE_DEPENDENCIES:
            raise
        return fail(f"kvpool watch: needs {exc.name}: pip install 'kvpool[live]'")
    try:
        sources = _sources(args)
    except ValueError as exc:
        return fail(f"kvpool watch: {exc}")
    gc.set_threshold(*GC_THRESHOLDS)
    out: IO[str] = sys.stdout if args.output == "-" else open(args.output, "a", encoding="utf-8")  # noqa: SIM115
    failed = [False]
    strict = args.strict

    def emit(report: Report) -> None:
        kind = report.finding.kind
        if kind == "violation" or (strict and kind in ("warning", "reaction")):
            failed[0] = True
        out.write(json.dumps(report.to_json()) + "\n")

    fleet = Fleet(sources, block_sizes=args.block_sizes, profiles=[profile_factory(r) for r in args.router],
                  history=args.history or HISTORY, sink=emit)
    capture = None
    try:
        if args.record:
            capture = CaptureWriter(args.record, Header(sources, args.topic))
        watcher = Watcher(fleet, sources, topic=args.topic, bind=args.bind, capture=capture,
                          give_up=args.give_up)
    except Exception as exc:  # a bad endpoint (zmq.ZMQError), an unwritable capture (OSError)
        return fail(f"kvpool watch: {exc}")
    server = None
    if args.metrics_port is not None:
        try:
            server = _serve_metrics(fleet, args.metrics_host, args.metrics_port)
        except OSError as exc:
            watcher.close()
            return fail(f"kvpool watch: metrics port {args.metrics_port}: {exc}")
        host, port = server.server_address[:2]
        print(f"kvpool watch: metrics on http://{host!s}:{port}/metrics", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: watcher.stop())
    started = last = time.monotonic()
    try:
        while not watcher.stopped:
            watcher.poll()
            out.flush()
            now = time.monotonic()
            if args.summary_every and now - last >= args.summary_every:
                last = now
                print(fleet.summary(now - started), file=sys.stderr, flush=True)
                if capture is not None:
                    capture.flush()
            if (args.max_batches is not None and fleet.totals()["batches"] >= args.max_batches) or (
                    args.duration is not None and now - started >= args.duration):
                break
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()
        if server is not None:
            server.shutdown()
    fleet.finish()
    print(fleet.summary(time.monotonic() - started), file=sys.stderr, flush=True)
    out.flush()
    if out is not sys.stdout:
        out.close()
    return 1 if failed[0] else 0


__all__ = ["LIVE_DEPENDENCIES", "main"]

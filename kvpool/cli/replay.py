"""``kvpool replay REQUESTS.jsonl``: a request trace through an engine loop, the pool checked throughout.

``--engine kvpool`` (the default; no vLLM needed) is kvpool's own
continuous-batching loop around any pool (``--pool MODULE:CLASS`` or
``--exec CMD``), in lockstep with the model; ``--engine vllm`` is vLLM's own
scheduler stack with no model, its pool shadowed by the model (``--plugin``,
as ``KVPOOL_PLUGIN`` says; ``shadow`` by default).  Details: ``docs/replay.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvpool.oracle.core.adapter import adapter_factory, adapter_for_class
from kvpool.oracle.replay.kvpool_engine import run_kvpool
from kvpool.oracle.replay.report import summary_rows, write_report
from kvpool.oracle.replay.requests import FORMATS, HASH_BLOCK_TOKENS, ReplayInputError, read_requests
from kvpool.oracle.replay.run import Replay, Settings
from kvpool.oracle.replay.vllm_engine import PLUGIN_MODES, environment_mode, run_vllm

from .. import vllm_plugin
from .events import router_name
from .usage import check_writable, command_parser, fail, import_or_exit


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "kvpool replay",
        "Replay a request trace (Mooncake's format or a plain one) through an engine loop: "
        "every pool call checked against the model; hit rates, evictions, preemptions, "
        "divergences, and what each --router profile would route wrongly.",
        "examples:\n  kvpool replay conversation_trace.jsonl --limit 500\n"
        "  kvpool replay trace.jsonl --engine vllm --report out/ --router dynamo\n"
        "  KVPOOL_PLUGIN=replace kvpool replay trace.jsonl --engine vllm\n"
        "exit codes: 0 no divergence, 1 a divergence or broken contract, 2 bad input")
    p.add_argument("requests", help="the request trace (JSON lines)")
    p.add_argument("--engine", choices=("kvpool", "vllm"), default="kvpool",
                   help="kvpool's own loop (default) or vLLM's scheduler (needs vLLM 0.31)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--pool", default=None, metavar="MODULE:CLASS",
                        help="--engine kvpool: the pool (default kvpool.impl:BlockPool)")
    target.add_argument("--exec", metavar='"CMD ARGS"',
                        help="--engine kvpool: a pool in another process, in the drive protocol")
    p.add_argument("--plugin", default=None, metavar="MODES",
                   help="--engine vllm: shadow (vLLM's pool under the model, the default), replace "
                        "(kvpool's pool), replace,shadow, or none (vLLM's pool bare); default "
                        "$KVPOOL_PLUGIN, else shadow")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the trace's format (auto)")
    p.add_argument("--hash-block-tokens", type=int, default=HASH_BLOCK_TOKENS, metavar="N",
                   help=f"Mooncake: tokens per hash id ({HASH_BLOCK_TOKENS})")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N requests")
    d = Settings()
    p.add_argument("--num-blocks", type=int, default=d.num_blocks, help=f"pool size ({d.num_blocks})")
    p.add_argument("--block-size", type=int, default=d.block_size, help=f"tokens per block ({d.block_size})")
    p.add_argument("--token-budget", type=int, default=d.token_budget,
                   help=f"tokens computed per step ({d.token_budget})")
    p.add_argument("--max-seqs", type=int, default=d.max_seqs, help=f"requests at once ({d.max_seqs})")
    p.add_argument("--events", action="store_true", help="KV events on (--router turns them on)")
    p.add_argument("--tokens-per-s", type=float, default=d.tokens_per_s,
                   help=f"the simulated clock: tokens a second ({d.tokens_per_s:g})")
    p.add_argument("--step-ms", type=float, default=d.step_ms,
                   help=f"the simulated clock: shortest step ({d.step_ms:g} ms)")
    p.add_argument("--max-waiting", type=int, default=d.max_waiting,
                   help=f"arrived requests queued in the engine at most ({d.max_waiting})")
    p.add_argument("--router", type=router_name, action="append", default=[], metavar="NAME",
                   help="a router profile asked at each admission (repeatable): set, refcount, dynamo, "
                        "llm-d:2025, llm-d:2026[,option=value]")
    p.add_argument("--trace", metavar="FILE", help="write the run as a trace (kvpool check-trace reads it)")
    p.add_argument("--report", metavar="DIR", help="write replay.md, replay.html, replay.json and plots")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--timeout", type=float, default=10.0, help="--exec: seconds a process may take (10)")
    return p


def _settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    settings = Settings(args.num_blocks, args.block_size, args.token_budget, args.max_seqs, args.events,
                        args.tokens_per_s, args.step_ms, args.max_waiting)
    problems = settings.problems()
    if args.limit is not None and args.limit < 1:
        problems.append("--limit must be positive")
    if args.hash_block_tokens < 1:
        problems.append("--hash-block-tokens must be positive")
    if problems:
        parser.error("; ".join(problems))
    return settings


def _kvpool(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings,
            requests: Any) -> Replay:
    if args.exec is not None:
        # lazy: the drive protocol only for --exec
        from kvpool.oracle.drive.adapter import DriveAdapter

        try:
            command = shlex.split(args.exec)
        except ValueError as exc:
            parser.error(f"--exec {args.exec!r}: {exc}")
        if not command:
            parser.error("--exec needs a command")
        with DriveAdapter(command, timeout=args.timeout, misuse=False) as adapter:
            return run_kvpool(requests, settings, adapter_factory(adapter), adapter.name,
                              errors_match=adapter.errors_match, routers=args.router, trace=args.trace)
    chosen = adapter_for_class(import_or_exit(parser, "--pool", args.pool or "kvpool.impl:BlockPool"))
    return run_kvpool(requests, settings, chosen.factory(), chosen.name, errors_match=chosen.errors_match,
                      routers=args.router, trace=args.trace)


def _vllm(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings,
          requests: Any) -> Replay:
    mode = args.plugin or environment_mode()
    if mode not in PLUGIN_MODES:
        parser.error(f"--plugin/KVPOOL_PLUGIN {mode!r}: expected one of {', '.join(PLUGIN_MODES)}")
    if args.trace and "shadow" not in mode:
        parser.error("--trace with --engine vllm records through the shadow: "
                     "--plugin shadow or replace,shadow")
    if importlib.util.find_spec("vllm") is None:
        parser.error("--engine vllm needs vLLM 0.31 installed (scripts/install-vllm.sh)")
    return run_vllm(requests, settings, vllm_plugin.use, mode=mode, routers=args.router, trace=args.trace)


def main(argv: Sequence[str] | None = None) -> int:
    """0: no divergence; 1: a divergence or broken contract; 2: usage or unreadable input."""
    parser = _parser()
    args = parser.parse_args(argv)
    settings = _settings(parser, args)
    if args.engine == "vllm" and (args.pool or args.exec):
        parser.error("--pool and --exec are for --engine kvpool (vLLM's pool is chosen by --plugin)")
    if args.engine == "kvpool" and args.plugin:
        parser.error("--plugin is for --engine vllm")
    check_writable("--trace", args.trace)
    if args.report is not None and Path(args.report).exists() and not Path(args.report).is_dir():
        parser.error(f"--report {args.report!r}: not a directory")
    requests = read_requests(args.requests, form=args.format, hash_block_tokens=args.hash_block_tokens,
                             limit=args.limit)
    try:
        first = next(requests, None)
    except ReplayInputError as exc:
        return fail(f"kvpool replay: {exc}")
    if first is None:
        return fail(f"kvpool replay: {args.requests}: no request in it")
    stream = itertools.chain([first], requests)
    try:
        replay = (_vllm if args.engine == "vllm" else _kvpool)(parser, args, settings, stream)
    except ReplayInputError as exc:
        return fail(f"kvpool replay: {exc}")
    result = replay.to_json()
    if args.report is not None:
        write_report(result, args.report)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"kvpool replay: {args.requests}")
        for what, value in summary_rows(result):
            print(f"  {what}: {value}")
        for finding in result["findings"][:20]:
            print(f"  finding: {finding}")
        if args.report is not None:
            print(f"  report: {Path(args.report) / 'replay.md'} (and replay.html)")
    return 1 if replay.divergences else 0


__all__ = ["main"]

"""A whole request trace through vLLM's scheduler (bare, shadowed, kvpool's pool) and kvpool's own loop.

    .venv-vllm/bin/python benchmarks/replay_trace.py TRACE.jsonl [--engines vllm,kvpool] [--limit N]

``TRACE.jsonl`` is a request trace ``kvpool replay`` reads: Mooncake's FAST'25
release (kvcache-ai/Mooncake, ``FAST25-release/traces/synthetic_trace.jsonl``,
3,993 requests; not in this repository: ``curl -LO https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/synthetic_trace.jsonl``,
sha256 ``bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131``).
``vllm`` runs vLLM 0.31's scheduler over the trace four times, the same trace
and settings (32,768 blocks of 16 tokens, budget 8,192): vLLM's pool bare,
under the shadow (its checker in a process of its own), under the shadow with
a checker that only counts what it is sent (the recording's own cost,
``count_records.py``), and kvpool's pool in its place.  Each run is a process
of its own (its checker in its process group), all set up first and then let
run a quarter of a second at a time in turn (:func:`take_turns`): this
machine's CPU time for one run varies by up to a third from one minute to the
next, and taking turns puts whatever else the host does on every run alike.
``kvpool`` runs kvpool's own loop around kvpool's pool in lockstep with the
model. Printed per run: requests, steps, pool calls checked, the engine's CPU
time (its process's) and the checker's, the time it was let run, hit rates,
evictions, preemptions, and the resident memory of the engine and the checker
sampled every second (first and last tenth of the run, peak); then the CPU
ratios shadowed / bare and kvpool's pool / bare (targets: the shadow at most 1.5x the bare
scheduler's CPU, the whole trace shadowed within 10 minutes), and whether the
vLLM runs scheduled every request alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import met, parser, rss_mib

from kvpool.oracle.core.adapter import kvpool_adapter
from kvpool.oracle.replay.kvpool_engine import run_kvpool
from kvpool.oracle.replay.requests import read_requests
from kvpool.oracle.replay.run import Replay, Settings

TARGET_RATIO = 1.5
COUNT_RECORDS = Path(__file__).with_name("count_records.py")
TARGET_WALL_S = 600.0


class Memory(threading.Thread):
    """The engine's and the checker's resident memory, every second, from its making to :meth:`stop`."""

    def __init__(self, checker: int | None) -> None:
        super().__init__(daemon=True)
        self.checker, self.done = checker, threading.Event()
        self.samples: list[tuple[float, float]] = []
        self.start()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.samples.append((rss_mib(), rss_mib(self.checker) if self.checker else 0.0))

    def stop(self) -> str:
        self.done.set()
        self.join()
        if not self.samples:
            return "memory: run shorter than a second"
        tenth = max(1, len(self.samples) // 10)
        parts = []
        for i, who in ((0, "engine"), (1, "checker")):
            values = [s[i] for s in self.samples]
            if not any(values):
                continue
            first, last = sum(values[:tenth]) / tenth, sum(values[-tenth:]) / tenth
            parts.append(f"{who} {first:.0f} MB in the first tenth, {last:.0f} MB in the last, peak "
                         f"{max(values):.0f} MB")
        return "memory: " + "; ".join(parts)


def summary(r: Replay) -> dict[str, Any]:
    """What :func:`show` prints of a run (bounded: an engine process sends it through a pipe)."""
    fields = ("requests", "steps", "calls", "cpu_s", "checker_cpu_s", "token_hit_rate", "request_hit_rate",
              "evictions", "preemptions", "divergences")
    return {**{f: getattr(r, f) for f in fields}, "findings": r.findings[:5]}


def show(name: str, r: dict[str, Any], seconds: float, memory: str) -> None:
    """One run: ``seconds`` is the time it ran (its wall time, less any time it was stopped)."""
    rate = r["calls"] / seconds if seconds > 0 else 0.0
    print(f"{name}: {r['requests']} requests, {r['steps']} steps; {r['calls']} pool calls checked "
          f"({rate:,.0f}/s); CPU engine {r['cpu_s']:.1f} s, checker {r['checker_cpu_s']:.1f} s; "
          f"ran {seconds:.1f} s")
    print(f"  hit rate {r['token_hit_rate']:.1%} of prompt tokens, {r['request_hit_rate']:.1%} of requests; "
          f"{r['evictions']} evictions, {r['preemptions']} preemptions; divergences {r['divergences']}")
    print(f"  {memory}")
    for finding in r["findings"]:
        print(f"  finding: {finding}")
    sys.stdout.flush()


RUNS = {"vLLM": "none", "shadow": "shadow", "recorded only": "shadow", "replace": "replace"}
"""The vLLM runs (name: plugin mode); "recorded only" has a checker that only counts."""
SLICE_S = 0.25
"""Seconds each engine process runs at a time before the next one's turn."""


def engine_process(path: str, settings: Settings, limit: int | None, name: str) -> int:
    """One vLLM run in this process, started and stopped by :func:`take_turns`: set up, say
    ``ready`` and stop; the result as one JSON line at the end."""
    # lazy: vLLM only for this part
    from kvpool import vllm_plugin
    from kvpool.oracle import shadow as sh
    from kvpool.oracle.replay.vllm_engine import run_vllm

    mode = RUNS[name]
    os.environ.setdefault(sh.ENV_DIR, tempfile.mkdtemp(prefix="kvpool-replay-bench-"))
    # vLLM's imports and its model registry's first look at the architecture, before the run counts
    run_vllm(read_requests(path, limit=2), settings, vllm_plugin.use, mode="none")
    checker = None
    if "shadow" in mode:  # the checker process started before the run, so its memory is watched
        if name == "recorded only":
            sh.hub.CHECKER = [str(COUNT_RECORDS)]
        sh.ShadowPool(kvpool_adapter().construct(4, True, 1, False)).get_num_free_blocks()
        sh.sync()
        hub = sh.hub.hub("process")
        checker = hub.child.pid if isinstance(hub, sh.hub.ProcessHub) else None
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # until the first turn
    memory = Memory(checker)
    r = run_vllm(read_requests(path, limit=limit), settings, vllm_plugin.use, mode=mode, keep_requests=True)
    measured = memory.stop()
    schedule = hashlib.sha256(repr([x.key() for x in r.records or ()]).encode()).hexdigest()
    print(json.dumps({**summary(r), "memory": measured, "schedule": schedule}), flush=True)
    sh.hub.finish()
    return 0


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return True


def take_turns(argv: list[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """Each named run in a process of its own (with its checker, in its process group), all set
    up first, then run :data:`SLICE_S` at a time in turn (why: the module's docstring); each keeps
    its heap and caches warm over a slice, and a checker runs only while its engine does.  A run's
    ``running_s`` is the time it was let run."""
    procs: dict[str, subprocess.Popen[str]] = {}
    for name in names:  # one at a time: set-up is not measured, but it must not overlap a turn
        proc = subprocess.Popen([sys.executable, "-W", "ignore", __file__, *argv, "--engine-process", name],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        if proc.stdout is None or proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {name} run did not start: exit {proc.wait()}")
        while not _stopped(proc.pid):
            time.sleep(0.01)
        procs[name] = proc
    running = dict.fromkeys(names, 0.0)
    live = list(names)
    try:
        while live:
            for name in list(live):
                proc = procs[name]
                os.killpg(proc.pid, signal.SIGCONT)
                began = time.perf_counter()
                try:
                    proc.wait(timeout=SLICE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGSTOP)
                running[name] += time.perf_counter() - began
                if proc.poll() is not None:
                    live.remove(name)
    finally:  # interrupted: no stopped process group is left behind
        for name in live:
            os.killpg(procs[name].pid, signal.SIGKILL)
    results = {}
    for name, proc in procs.items():
        lines = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"the {name} run failed: exit {proc.returncode}")
        results[name] = {**json.loads(lines[-1]), "running_s": running[name]}
    return results


def run_vllm_modes(argv: list[str]) -> None:
    results = take_turns(argv, list(RUNS))
    for name, r in results.items():
        show(f"vLLM's scheduler, {name}", r, r["running_s"], r["memory"])
    bare, shadow = results["vLLM"], results["shadow"]
    ratio = shadow["cpu_s"] / bare["cpu_s"]
    total = (shadow["cpu_s"] + shadow["checker_cpu_s"]) / bare["cpu_s"]
    same = len({r["schedule"] for r in results.values()}) == 1
    print(f"CPU ratios (engine): shadowed / bare {ratio:.2f} (target at most {TARGET_RATIO}: "
          f"{met(ratio <= TARGET_RATIO)}), kvpool's pool / bare "
          f"{results['replace']['cpu_s'] / bare['cpu_s']:.2f}; with the checker process's CPU: shadowed / "
          f"bare {total:.2f}")
    print(f"  of which recording (the same calls, a checker that only counts them): "
          f"{results['recorded only']['cpu_s'] / bare['cpu_s']:.2f}; the rest is the engine's share of the "
          f"machine with a busy checker beside it")
    print(f"shadowed run: {shadow['running_s']:.0f} s of running time (target at most {TARGET_WALL_S:.0f} s: "
          f"{met(shadow['running_s'] <= TARGET_WALL_S)}); every request scheduled alike "
          f"in the {len(results)} runs: {'yes' if same else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, engines="vllm,kvpool", num_blocks=32768)
    ap.add_argument("trace")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--engine-process", choices=list(RUNS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    settings = Settings(num_blocks=args.num_blocks)
    if args.engine_process:  # one run of run_vllm_modes, in the process it started
        return engine_process(args.trace, settings, args.limit, args.engine_process)
    print(f"{args.trace}: {args.limit or 'every'} request(s); {settings.num_blocks} blocks of "
          f"{settings.block_size} tokens, budget {settings.token_budget}; {os.cpu_count()} cores")
    if "vllm" in args.engines:
        run_vllm_modes([args.trace, "--num-blocks", str(args.num_blocks),
                        *(["--limit", str(args.limit)] if args.limit else [])])
    if "kvpool" in args.engines:
        adapter = kvpool_adapter()
        memory = Memory(None)
        r = run_kvpool(read_requests(args.trace, limit=args.limit), settings, adapter.factory(), adapter.name,
                       errors_match=adapter.errors_match)
        show("kvpool's loop, kvpool's pool in lockstep with the model", summary(r), r.wall_s, memory.stop())
    return 0


if __name__ == "__main__":
    sys.exit(main())

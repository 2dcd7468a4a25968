"""How fast ``kvpool watch`` checks an engine's stream on one core, and how far behind it runs.

The stream is what kvpool's pool publishes under the ``serving`` workload
(``benchmarks/workloads.py``: chunked prefill, multi-turn chats, LoRA and salted
requests, hits re-announced, block size 16), one ``KVEventBatch`` per scheduler
step, encoded as vLLM encodes it.  Each stage below handles every batch as the
watcher does (frames -> sequencer -> decoder -> checks), timed in CPU seconds of
this process (one thread), best of ``--repeat``, with the collector tuned as ``kvpool watch``
tunes it (``GC_THRESHOLDS``); printed per stage: events/s,
batches/s, and the ratio of its time to the *baseline* measured in the same run,
decoding alone:

* ``decode``: the payloads decoded (msgspec), nothing checked: the baseline;
* ``check``: the watcher's whole path with the rules and warnings (no profile);
* ``check+2``: the same with two router profiles on (``dynamo``, ``llm-d``);
* ``check+4``: with four (``set``, ``refcount`` too);
* ``long+2``: ``check+2`` with a history of ``--history`` keys (default 8,192), which the stream
  runs past as a run of days runs past the default's 65,536: the cost per event once every removal
  also drops the oldest remembered key (it should be ``check+2``'s, whatever the run's length).

The load average at the start is printed: the machine may be shared.

Then the lag: a publisher process sends the batches over ZMQ (localhost) at
``--load`` times the ``check+2`` rate just measured, paced; the watcher polls
them, and each batch's lag is the time from its timestamp (set when sent) to the
end of its check.  Wall clock, on a shared machine: read it as an order.

    python benchmarks/watch_speed.py [--requests 1500] [--repeat 5] [--load 0.5] [--history 8192]
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parser
from workloads import WORKLOADS

from kvpool.impl import BlockPool
from kvpool.impl.events import event_fields
from kvpool.oracle.events.capture import Source
from kvpool.oracle.events.fleet import GC_THRESHOLDS, Fleet
from kvpool.oracle.events.online import HISTORY
from kvpool.oracle.events.routers import profile_factory
from kvpool.oracle.events.wire import Decoder, encode_batch

STAGES = {"check": [], "check+2": ["dynamo", "llm-d"], "check+4": ["dynamo", "llm-d", "set", "refcount"]}


def stream(requests: int, seed: int) -> list[list[dict[str, Any]]]:
    """Every scheduler step's events (vLLM's fields), from kvpool's pool under the serving workload."""
    work = WORKLOADS["serving"]
    pool = BlockPool(work.default_blocks, True, 16, enable_kv_cache_events=True)
    steps: list[list[dict[str, Any]]] = []
    original = pool.take_events

    def take() -> list[Any]:
        events = original()
        steps.append([event_fields(e) for e in events])
        return events

    pool.take_events = take  # type: ignore[method-assign]
    work.drive(pool, work.make(requests, seed), seed, lambda op, n, method, *args: method(*args))
    return [s for s in steps if s]


def decode_only(messages: list[list[bytes]]) -> None:
    decoder = Decoder()
    for m in messages:
        decoder.decode(m[2])


def check(messages: list[list[bytes]], routers: list[str], history: int = HISTORY) -> Fleet:
    fleet = Fleet([Source("bench")], block_sizes={0: 16}, profiles=[profile_factory(r) for r in routers],
                  sink=lambda report: None, clock=lambda: 0.0, history=history)
    for record, m in enumerate(messages, start=1):
        fleet.message(record, 0.0, 0, "pub", m)
    return fleet


PUBLISHER = """
import sys, time, zmq, msgspec
endpoint, rate, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
batches = msgspec.msgpack.decode(open(path, "rb").read())
pub = zmq.Context.instance().socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)
pub.bind(endpoint)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()  # the watcher has subscribed
start, sent = time.perf_counter(), 0
for seq, (events, payload) in enumerate(batches):
    while time.perf_counter() < start + sent / rate:
        time.sleep(0.0002)
    ts = msgspec.msgpack.encode(time.time())  # the batch's timestamp, patched in: sent now
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload[:1] + ts + payload[1 + len(ts):]])
    sent += events
time.sleep(1)
"""


def lag(batches: list[list[dict[str, Any]]], rate: float, routers: list[str]) -> tuple[list[float], float]:
    """Lags (s) of the batches a publisher process sends at ``rate`` events/s over ZMQ, read as the
    watcher polls, and how long it took."""
    import socket
    import subprocess
    import tempfile

    import msgspec

    from kvpool.oracle.events.subscribe import Watcher

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile(suffix=".msgpack", delete=False) as f:
        f.write(msgspec.msgpack.encode([(len(b), encode_batch(b, time.time())) for b in batches]))
    publisher = subprocess.Popen([sys.executable, "-c", PUBLISHER, endpoint, str(rate), f.name],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert publisher.stdin is not None and publisher.stdout is not None
    publisher.stdout.readline()
    lags: list[float] = []
    fleet = Fleet([Source(endpoint)], block_sizes={0: 16}, profiles=[profile_factory(r) for r in routers],
                  sink=lambda report: None)
    watcher = Watcher(fleet, [Source(endpoint)], hwm=0)
    time.sleep(0.5)  # the subscription takes a moment
    publisher.stdin.write("go\n")
    publisher.stdin.flush()
    total, seen, began = sum(len(b) for b in batches), 0, time.perf_counter()
    while seen < total and publisher.poll() is None:
        watcher.poll(100)
        for engine in list(fleet.engines.values()):
            if engine.counts.events > seen:
                lags.append(engine.counts.lag)
                seen = engine.counts.events
    elapsed = time.perf_counter() - began
    publisher.wait()
    watcher.close()
    Path(f.name).unlink()
    return lags, elapsed


def best(run: Callable[[], object], repeat: int) -> float:
    """The fewest processor seconds of ``repeat`` runs of ``run()``, each after a collection (untimed)."""
    shortest = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        run()
        shortest = min(shortest, time.process_time() - start)
    return shortest


def main(argv: list[str]) -> int:
    args = parser(__doc__, requests=1500, seed=1, repeat=5,
                  load=(0.5, "offered rate, as a share of check+2's"),
                  history=(8_192, "long+2's history (keys remembered)")).parse_args(argv)
    timed = partial(best, repeat=args.repeat)
    gc.set_threshold(*GC_THRESHOLDS)  # as kvpool watch runs
    batches = stream(args.requests, args.seed)
    messages = [[b"", seq.to_bytes(8, "big"), encode_batch(b, 0.0)] for seq, b in enumerate(batches)]
    events = sum(len(b) for b in batches)
    hashes = sum(len(e.get("block_hashes", ())) for b in batches for e in b)
    stored = sum(e["type"] == "BlockStored" for b in batches for e in b)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print(f"stream: {len(batches):,} batches, {events:,} events ({stored:,} BlockStored, {hashes:,} block "
          f"hashes), from the serving workload ({args.requests} requests, block size 16)")
    base = timed(lambda: decode_only(messages))
    print(f"{'stage':>9} {'events/s':>10} {'batches/s':>10} {'x decode':>9}")
    print(f"{'decode':>9} {events / base:>10,.0f} {len(batches) / base:>10,.0f} {1.0:>9.2f}")
    rates = {}
    for name, routers in STAGES.items():
        seconds = timed(lambda routers=routers: check(messages, routers))
        rates[name] = events / seconds
        print(f"{name:>9} {events / seconds:>10,.0f} {len(batches) / seconds:>10,.0f} {seconds / base:>9.2f}")
    seconds = timed(lambda: check(messages, STAGES["check+2"], args.history))
    print(f"{'long+2':>9} {events / seconds:>10,.0f} {len(batches) / seconds:>10,.0f} {seconds / base:>9.2f}"
          f"   (history {args.history:,}: {events / seconds / rates['check+2']:.2f} of check+2's rate)")
    fleet = check(messages, STAGES["check+2"])
    findings = sum(sum(e.counts.findings.values()) for e in fleet.engines.values())
    print(f"(check+2 found {findings:,} warnings and router reactions on this stream, no violation: "
          f"{fleet.totals()['violation'] == 0})")
    rate = rates["check+2"] * args.load
    lags, seconds = lag(batches, rate, STAGES["check+2"])
    lags.sort()
    print(f"lag over ZMQ, {len(lags):,} reads over {seconds:.1f} s at {rate:,.0f} events/s offered "
          f"({args.load:.0%} of check+2), two profiles: median {statistics.median(lags) * 1000:.1f} ms, "
          f"p99 {lags[int(len(lags) * 0.99)] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

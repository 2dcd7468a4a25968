"""``kvpool watch`` on a live wire: a publisher speaking vLLM's protocol (kvpool's pool as the engine), a
proxy that drops, duplicates and reorders batches, a publisher restart, a seeded bug reported at its
batch, a capture that replays to the same findings, the command line with its metrics.  vLLM's own
publisher and pool: tests/test_live_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq", reason="kvpool watch needs pyzmq: pip install 'kvpool[live]'")
pytest.importorskip("msgspec", reason="the wire decoder needs msgspec: pip install 'kvpool[live]'")

from live_helpers import (  # noqa: E402 (after the skips)
    SAFETY,
    FaultProxy,
    Plan,
    Publisher,
    free_ports,
    kvpool_workload,
    publish_json,
    publish_steps,
    seeded_at,
    wait_until,
    wrong_parent,
)

from kvpool.impl import BlockPool  # noqa: E402
from kvpool.oracle.events.capture import CaptureWriter, Header, Source, is_capture  # noqa: E402
from kvpool.oracle.events.fleet import Fleet, Report, replay_capture  # noqa: E402
from kvpool.oracle.events.metrics import render  # noqa: E402
from kvpool.oracle.events.routers import profile_factory  # noqa: E402
from kvpool.oracle.events.subscribe import Watcher  # noqa: E402
from kvpool.oracle.events.wire import encode_batch  # noqa: E402

ROUTERS = [profile_factory("dynamo"), profile_factory("llm-d")]


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def found(reports: list[Report], *kinds: str) -> list[tuple[str, str, int, int | None, int | None]]:
    return [(r.engine, r.finding.rule, r.finding.position.line, r.finding.position.seq,
             r.finding.position.index) for r in reports if r.finding.kind in kinds]


def delivered(fleet: Fleet) -> int:
    return sum(e.counts.batches for e in fleet.engines.values())


def test_faults_are_undone_and_the_seeded_bug_is_reported_at_its_batch(tmp_path: Path) -> None:
    pub_port, replay_port, proxy_port = free_ports(3)
    epoch = [0]
    publisher = Publisher(tcp(pub_port), tcp(replay_port))
    plan = Plan()
    proxy = FaultProxy(tcp(pub_port), tcp(proxy_port), plan, lambda: epoch[0])
    source = Source(tcp(proxy_port), tcp(replay_port))
    fleet = Fleet([source], block_sizes={0: 4}, profiles=ROUTERS)
    capture = tmp_path / "run.kvwire"
    watcher = Watcher(fleet, [source], capture=CaptureWriter(capture, Header([source])), give_up=SAFETY)
    try:
        wait_until(lambda: _joined(watcher, publisher), "the subscription")
        at = publisher.seq
        plan.drop, plan.twice, plan.late = {at + 5, at + 6, at + 31}, {at + 10, at + 11}, {at + 20, at + 40}
        work = kvpool_workload(seed=3, pool_class=wrong_parent(BlockPool, at=12))
        batches: dict[int, list[dict[str, Any]]] = {}
        for _ in range(60):
            batches.update(publish_steps(publisher, work, 1, publish_json))
            watcher.poll(0)
        wait_until(lambda: delivered(fleet) == at + 60, "60 batches in sequence", lambda: watcher.poll(50))
        (engine,) = fleet.engines.values()
        stats = engine.sequencer.stats
        assert stats.lost == 0 and stats.duplicates >= 2 and stats.recovered >= 3
        assert [(e, rule, seq, i) for e, rule, _, seq, i in found(fleet.reports, "violation")] == [
            (engine.name, "parent-unknown", seq, i) for seq, i in seeded_at(batches)]
        assert not found(fleet.reports, "gap", "joined", "restart", "undecodable")

        publisher.close()  # the engine restarts: a new pool, its sequence from 0
        epoch[0] = 1
        publisher = Publisher(tcp(pub_port), tcp(replay_port))
        work = kvpool_workload(seed=4)
        wait_until(lambda: _restarted(fleet, publisher, work), "the new engine's first batches",
                   lambda: watcher.poll(50))
        assert [r.finding.rule for r in fleet.reports if r.finding.kind == "restart"] == ["restart"]
        assert engine.reading.checker.horizon is None  # read from its first batch: an empty index
        assert len(found(fleet.reports, "violation")) == 1
        assert "kvpool_watch_restarts_total" in render(fleet) and 'kind="violation"' in render(fleet)
    finally:
        watcher.close()
        proxy.close()
        publisher.close()
    replayed = replay_capture(capture, block_sizes={0: 4}, profiles=ROUTERS)
    kinds = ("violation", "warning", "reaction", "gap", "joined", "restart", "late")
    assert found(replayed.reports, *kinds) == found(fleet.reports, *kinds)


def _restarted(fleet: Fleet, publisher: Publisher, work: Any) -> bool:
    """Publish a batch now and then until the watcher has read ten batches of the new engine."""
    (engine,) = fleet.engines.values()
    if engine.sequencer.epochs and engine.sequencer.expected is not None and engine.sequencer.expected >= 10:
        return True
    if publisher.seq < 40:
        publish_steps(publisher, work, 1, publish_json)
    return False


def test_a_gap_the_replay_socket_no_longer_has_is_reported_with_its_size(tmp_path: Path) -> None:
    """Batches 10-17 dropped and the publisher buffering 2: the gap is lost; what was stored before it
    is not judged (no false violation as its keys are removed) until the pool is reset."""
    pub_port, replay_port, proxy_port = free_ports(3)
    publisher = Publisher(tcp(pub_port), tcp(replay_port), buffer_steps=2)
    plan = Plan()
    proxy = FaultProxy(tcp(pub_port), tcp(proxy_port), plan)
    source = Source(tcp(proxy_port), tcp(replay_port))
    fleet = Fleet([source], block_sizes={0: 4}, profiles=ROUTERS)
    watcher = Watcher(fleet, [source], give_up=SAFETY)
    try:
        wait_until(lambda: _joined(watcher, publisher), "the subscription")
        plan.drop = set(range(publisher.seq + 10, publisher.seq + 18))
        work = kvpool_workload(seed=5, reset_every=25)
        for _ in range(70):
            publish_steps(publisher, work, 1, publish_json)
            watcher.poll(0)
        wait_until(lambda: fleet.engines and next(iter(fleet.engines.values())).sequencer.expected
                   == publisher.seq, "every batch delivered or lost", lambda: watcher.poll(50))
    finally:
        watcher.close()
        proxy.close()
        publisher.close()
    (engine,) = fleet.engines.values()
    gaps = [r for r in fleet.reports if r.finding.kind in ("gap", "joined")]
    stats = engine.sequencer.stats
    assert len(gaps) <= 2 and sum(g.lost for g in gaps) == stats.lost  # joining may have lost some too
    (gap,) = [g for g in gaps if g.finding.kind == "gap"] or [None]
    assert gap is not None and len([g for g in gaps if g.finding.kind == "gap"]) == 1, (
        [g.to_json() for g in gaps], sorted(plan.drop), engine.sequencer.stats)
    assert 6 <= gap.lost <= 8 and gap.finding.position.seq == min(plan.drop) + gap.lost
    assert engine.counts.batches + stats.lost == publisher.seq
    assert not found(fleet.reports, "violation")
    assert engine.reading.checker.unjudged > 0  # removals of keys stored before the gap
    assert engine.reading.checker.horizon is None  # a reset after it: judged again


def _joined(watcher: Watcher, publisher: Publisher) -> bool:
    """Publish an empty batch until the watcher has one (the subscription took)."""
    publisher.publish(encode_batch([], 0.0))
    watcher.poll(20)
    return watcher.fleet.totals()["batches"] > 0


def test_data_parallel_ranks_and_several_engines_on_one_bound_endpoint() -> None:
    (base,) = free_ports(1)
    sources = [Source(tcp(base), None, 0), Source(f"tcp://127.0.0.1:{base + 1}", None, 1)]
    fleet = Fleet(sources)
    try:
        watcher = Watcher(fleet, sources, bind=True)
    except zmq.ZMQError:
        pytest.skip(f"port {base + 1} is taken (the test needs two consecutive free ports)")
    pubs = [Publisher(tcp(base), None, topic=b"kv@pod-a@m", connect=True),
            Publisher(tcp(base), None, topic=b"kv@pod-b@m", connect=True),
            Publisher(f"tcp://127.0.0.1:{base + 1}", None, topic=b"kv@pod-a@m", connect=True)]
    try:
        def step() -> None:
            for rank, pub in zip((0, 0, 1), pubs, strict=True):
                pub.publish(encode_batch([], 1.0, 0 if pub is pubs[2] and pub.seq == 5 else rank))
            watcher.poll(20)
        wait_until(lambda: len(fleet.engines) == 3 and all(
            e.counts.batches > 6 for e in fleet.engines.values()), "three engines", step)
    finally:
        watcher.close()
        for p in pubs:
            p.close()
    assert sorted(e.name for e in fleet.engines.values()) == sorted(
        [f"{tcp(base)} topic kv@pod-a@m", f"{tcp(base)} topic kv@pod-b@m",
         f"tcp://127.0.0.1:{base + 1} topic kv@pod-a@m"])
    assert [r.engine for r in fleet.reports if r.finding.kind == "dp-rank-mismatch"] == [
        f"tcp://127.0.0.1:{base + 1} topic kv@pod-a@m"]


def test_the_command_line_writes_findings_metrics_and_a_capture_check_events_replays(tmp_path: Path) -> None:
    pub_port, replay_port = free_ports(2)
    out, capture = tmp_path / "findings.jsonl", tmp_path / "run.kvwire"
    publisher = Publisher(tcp(pub_port), tcp(replay_port))
    work = kvpool_workload(seed=7, pool_class=wrong_parent(BlockPool, at=5))
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "kvpool", "watch", tcp(pub_port), "--replay", tcp(replay_port),
         "--router", "dynamo", "--block-sizes", "0=4", "--output", str(out), "--record", str(capture),
         "--metrics-port", "0", "--metrics-host", "127.0.0.1", "--max-batches", "40",
         "--summary-every", "0", "--give-up", str(SAFETY)], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "metrics on http://" in line, line
        url = line.split()[-1]
        batches: dict[int, list[dict[str, Any]]] = {}
        metrics = [""]

        def scraped() -> bool:  # a batch more until the watcher has some (its subscription takes a moment)
            metrics[0] = _get(url)
            if "kvpool_watch_events_total{" in metrics[0]:
                return True
            if len(batches) < 30:
                batches.update(publish_steps(publisher, work, 1, publish_json))
            return False

        wait_until(scraped, "metrics")  # the watcher runs until 40 batches: some are still to come
        batches.update(publish_steps(publisher, work, 40 - len(batches), publish_json))
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        publisher.close()
    assert proc.returncode == 1, err  # the seeded bug: a violation
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    violations = [(x["seq"], x["event"]) for x in lines if x["kind"] == "violation"]
    assert violations == seeded_at(batches) and "kvpool watch: 1 engine(s), 40 batch(es)" in err
    assert "# TYPE kvpool_watch_lag_seconds gauge" in metrics[0]
    assert is_capture(capture)
    done = subprocess.run([sys.executable, "-P", "-m", "kvpool", "check-events", str(capture), "--json",
                           "--router", "dynamo", "--block-sizes", "0=4"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    (engine,) = json.loads(done.stdout)["engines"]
    keep = ("kind", "rule", "record", "seq", "event", "message")
    assert [{k: f[k] for k in keep} for f in engine["findings"]] == [{k: x[k] for k in keep} for x in lines]


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""

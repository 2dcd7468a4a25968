"""``kvpool watch`` against vLLM's own publisher: a real ``ZmqEventPublisher`` sending what a real vLLM
``BlockPool`` emits under a workload, with faults between it and the watcher (batches dropped, sent
twice, reordered; a slow subscriber that vLLM's high-water mark drops batches for; a publisher restart;
a replay buffer too short for a gap) and a seeded bug in the pool that must be reported at its batch.

Skipped unless vLLM is importable: ``scripts/install-vllm.sh`` makes it so on a CPU-only machine, and
``.ci/run`` runs this file in its vLLM stage.  No GPU, a few seconds.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from vllm_helpers import REASON, vllm_pool, vllm_requests  # skips this module without vLLM

vllm_events = pytest.importorskip("vllm.distributed.kv_events", reason=REASON)
vllm_config = pytest.importorskip("vllm.config.kv_events", reason=REASON)

import msgspec  # noqa: E402 (vLLM's own dependency, as zmq is)
import zmq  # noqa: E402
from live_helpers import (  # noqa: E402
    SAFETY,
    FaultProxy,
    Plan,
    Workload,
    free_ports,
    publish_steps,
    seeded_at,
    wait_until,
    wrong_parent,
)

from kvpool.impl.events import event_fields  # noqa: E402
from kvpool.oracle.events.capture import Source  # noqa: E402
from kvpool.oracle.events.fleet import Fleet, Report  # noqa: E402
from kvpool.oracle.events.routers import profile_factory  # noqa: E402
from kvpool.oracle.events.subscribe import Watcher  # noqa: E402
from kvpool.oracle.events.wire import Decoder, encode_batch, rank_endpoint  # noqa: E402

BS = 4
ROUTERS = [profile_factory("dynamo"), profile_factory("llm-d")]


def local(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


class VllmPublisher:
    """vLLM's ZmqEventPublisher, counting the batches it was given (its sequence numbers, from 0)."""

    def __init__(self, port: int, replay: int, rank: int = 0, **options: Any):
        config = vllm_config.KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                            endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay}",
                                            topic="kv", **options)
        self.pub = vllm_events.EventPublisherFactory.create(config, data_parallel_rank=rank)
        self.seq = 0

    def publish(self, events: list[Any]) -> int:
        self.pub.publish(vllm_events.KVEventBatch(ts=time.time(), events=events))
        self.seq += 1
        return self.seq - 1

    def close(self) -> None:
        self.pub.shutdown()


def restarted(port: int, replay: int, **options: Any) -> VllmPublisher:
    """A new publisher on the ports of one shut down a moment ago (ZMQ frees a port in the background)."""
    made: list[VllmPublisher] = []

    def bound() -> bool:
        try:
            made.append(VllmPublisher(port, replay, **options))
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
            time.sleep(0.05)
        return bool(made)

    wait_until(bound, "the ports to be free")
    return made[0]


def publish(publisher: VllmPublisher, events: list[Any]) -> int:
    return publisher.publish(events)


def vllm_workload(seed: int, pool_class: Any = None, reset_every: int = 0) -> Workload:
    pool = (pool_class or vllm_pool.BlockPool)(48, True, BS, enable_kv_cache_events=True)
    return Workload(pool, vllm_requests(BS), BS, seed, reset_every)


def engine_of(fleet: Fleet) -> Any:
    (engine,) = fleet.engines.values()
    return engine


def kinds(reports: list[Report], *names: str) -> list[Report]:
    return [r for r in reports if r.finding.kind in names]


def joined(watcher: Watcher, publisher: VllmPublisher) -> bool:
    publisher.publish([])
    watcher.poll(20)
    return watcher.fleet.totals()["batches"] > 0


def read_up_to(watcher: Watcher, publisher: VllmPublisher, seq: int) -> None:
    """Poll until batch ``seq`` is read, publishing an empty batch each time round the watcher holds
    no hole: a batch dropped last shows only when one comes after it (vLLM's high-water mark may drop
    any).  While a hole is being filled, nothing is added: on a slow machine every round would grow
    the stream behind the hole until it outgrew the watcher's hold or vLLM's replay buffer."""

    def step() -> None:
        if not engine_of(watcher.fleet).sequencer.waiting:
            publisher.publish([])
        watcher.poll(50)

    wait_until(lambda: (engine_of(watcher.fleet).sequencer.expected or 0) > seq, f"batch {seq} read", step)


def test_vllms_publisher_through_faults_a_slow_subscriber_and_a_restart() -> None:
    port, replay, proxy_port = free_ports(3)
    epoch = [0]
    publisher = VllmPublisher(port, replay, hwm=50)
    plan = Plan()
    proxy = FaultProxy(local(port), local(proxy_port), plan, lambda: epoch[0])
    source = Source(local(proxy_port), local(replay))
    fleet = Fleet([source], block_sizes={0: BS}, profiles=ROUTERS)
    watcher = Watcher(fleet, [source], hwm=20, give_up=SAFETY)  # lost only if vLLM says so: no timer
    try:
        wait_until(lambda: joined(watcher, publisher), "the subscription")
        at = publisher.seq
        plan.drop, plan.twice, plan.late = {at + 3, at + 4, at + 21}, {at + 8}, {at + 12, at + 30}
        work = vllm_workload(seed=1, pool_class=wrong_parent(vllm_pool.BlockPool, at=9))
        batches = {}
        for _ in range(50):
            batches.update(publish_steps(publisher, work, 1, publish))
            watcher.poll(0)
        read_up_to(watcher, publisher, max(batches))
        stats = engine_of(fleet).sequencer.stats
        assert stats.lost == 0 and stats.duplicates >= 1 and stats.recovered >= 3
        bug = seeded_at(batches)
        assert len(bug) == 1
        assert [(r.finding.rule, r.finding.position.seq, r.finding.position.index)
                for r in kinds(fleet.reports, "violation")] == [("parent-unknown", *bug[0])]

        # A slow subscriber: the watcher reads nothing while vLLM publishes; vLLM's PUB (high-water
        # mark 50) and the proxy drop what does not fit, and the replay buffer gives it back.  The hole
        # stays under what vLLM's replay ROUTER queues (its default high-water mark, 1,000): a longer
        # answer loses its tail and end marker whenever this machine is too busy to read it in time.
        proxy.paused.set()
        slow = publish_steps(publisher, work, 900, publish)
        publisher.pub._event_queue.join()  # vLLM's publisher thread has sent every one of them
        proxy.paused.clear()
        read_up_to(watcher, publisher, max(slow))
        stats = engine_of(fleet).sequencer.stats
        assert stats.lost == 0 and stats.delivered >= max(slow) + 1
        # What ZMQ's and the kernel's buffers held arrives as it was sent; the rest comes back through
        # the replay socket (how much of each depends on the kernel's buffers, not on this test).
        assert stats.recovered >= 1
        assert len(kinds(fleet.reports, "violation")) == 1

        # The engine restarts: a new pool and publisher, its sequence from 0.  Its replay buffer holds
        # 4 batches, and the proxy drops 8 in a row: that gap is lost, reported with its size.
        publisher.close()
        epoch[0] = 1
        publisher = restarted(port, replay, buffer_steps=4)
        work = vllm_workload(seed=2, reset_every=30)
        wait_until(lambda: engine_of(fleet).sequencer.epochs == 1 and engine_of(fleet).sequencer.expected,
                   "the new engine", lambda: (publisher.publish([]), watcher.poll(20)))
        assert [r.finding.kind for r in kinds(fleet.reports, "restart")] == ["restart"]
        at = publisher.seq + 5
        plan.drop, plan.twice, plan.late = set(range(at, at + 8)), set(), set()
        epoch[0] = 0  # the plan applies again
        last = max(publish_steps(publisher, work, 70, publish))
        read_up_to(watcher, publisher, last)
    finally:
        watcher.close()
        proxy.close()
        publisher.close()
    engine = engine_of(fleet)
    # The new engine's first batches may be lost too (sent before the proxy had reconnected, and its
    # buffer holds 4); after those, the only batches lost are the ones the proxy dropped.
    (gap,) = [g for g in kinds(fleet.reports, "gap") if g.finding.position.seq > min(plan.drop)]
    assert 4 <= gap.lost <= 8 and gap.finding.position.seq == min(plan.drop) + gap.lost
    assert len(kinds(fleet.reports, "violation")) == 1  # no false violation after the lost gap
    assert engine.reading.checker.horizon is None  # the pool was reset since: judged again


def test_data_parallel_ranks_publish_where_the_watcher_looks() -> None:
    port, replay = free_ports(2)
    publisher = VllmPublisher(port, replay, rank=1)
    source = Source(rank_endpoint(local(port), 1), rank_endpoint(local(replay), 1), 1)
    fleet = Fleet([source])
    watcher = Watcher(fleet, [source])
    try:
        wait_until(lambda: joined(watcher, publisher), "rank 1's batches")
    finally:
        watcher.close()
        publisher.close()
    assert not fleet.reports  # rank 1 on the port plus 1, its batches saying rank 1


def test_kvpools_encoder_writes_vllms_bytes_and_reads_them() -> None:
    import vllm

    release = ".".join(vllm.__version__.split(".")[:2])
    work = vllm_workload(seed=3, reset_every=7)
    encode = msgspec.msgpack.Encoder().encode
    decoder = Decoder()
    seen = 0
    for _ in range(120):
        events = work.step()
        theirs = encode(vllm_events.KVEventBatch(ts=1.25, events=events, data_parallel_rank=2))
        dicts = [event_fields(e) for e in events]
        assert encode_batch(dicts, 1.25, 2, release) == theirs
        batch = decoder.decode(theirs)
        read = [{k: v for k, v in e.items() if k in d} for e, d in zip(batch.events, dicts, strict=True)]
        assert read == dicts
        seen += len(events)
    assert seen > 50 and not decoder.unknown
    if "lookahead_token_ids" in vllm_events.BlockStored.__struct_fields__:  # vLLM 0.33
        event = vllm_events.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[1, 2, 3, 4],
                                        block_size=2, lora_id=None, medium="GPU", lora_name=None,
                                        group_idx=0, lookahead_token_ids=[[5], [6]])
        theirs = encode(vllm_events.KVEventBatch(ts=1.0, events=[event]))
        assert encode_batch([decoder.decode(theirs).events[0]], 1.0) == theirs

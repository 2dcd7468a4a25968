"""What the live watcher's tests put around it: a publisher speaking vLLM's protocol (for the runs without
vLLM; tests/test_live_vllm.py uses vLLM's own), a proxy between publisher and watcher that drops,
duplicates and reorders batches on a plan, a pool driven step by step, and a watcher polled until it
has seen what was published.  No verdict here reads a clock: waits end when a condition holds, and only
a generous safety net fails them."""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from kvpool.impl import BlockPool, Request, get_request_block_hasher
from kvpool.impl.events import event_fields
from kvpool.oracle.events.wire import encode_batch

SAFETY = 120.0
"""Seconds a wait may take before the test fails (a hang, not a slow machine)."""


def free_ports(n: int) -> list[int]:
    """``n`` ports free on localhost now (a range of DP-rank ports must be consecutive: see ``base``)."""
    out = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out.append(s.getsockname()[1])
    return out


def wait_until(condition: Callable[[], bool], what: str, step: Callable[[], Any] | None = None) -> None:
    deadline = time.monotonic() + SAFETY
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {SAFETY:.0f} s waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.01)


def rebind(sock: Any, endpoint: str) -> None:
    """Bind, waiting while a socket closed a moment ago still holds the port (ZMQ closes it later)."""

    def bound() -> bool:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
            time.sleep(0.05)
            return False
        return True

    wait_until(bound, f"{endpoint} to be free")


class Publisher:
    """vLLM's ZmqEventPublisher as the wire sees it: PUB ``[topic, seq, payload]``; a ROUTER that answers
    ``[id, b"", start]`` with every buffered batch from ``start`` on, then the end marker."""

    END = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, endpoint: str, replay: str | None, buffer_steps: int = 10_000, topic: bytes = b"",
                 hwm: int = 100_000, connect: bool = False):
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect:
            self.pub.connect(endpoint)
        else:
            rebind(self.pub, endpoint)
        self.topic, self.seq = topic, 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.lock = threading.Lock()
        self.running = True
        self.thread: threading.Thread | None = None
        if replay is not None:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            rebind(self.router, replay)
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def publish(self, payload: bytes) -> int:
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve(self) -> None:
        while self.running:
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            with self.lock:
                batches = [b for b in self.buffer if b[0] >= int.from_bytes(start, "big")]
            for seq, payload in batches:
                self.router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", b"", self.END, b""])

    def close(self) -> None:
        self.running = False
        if self.thread is not None:
            self.thread.join()
            self.router.close(linger=0)
        self.pub.close(linger=0)


@dataclass
class Plan:
    """What the proxy does to each batch, by sequence number: drop it, send it twice, or hold it
    back until the next one has gone."""

    drop: set[int] = field(default_factory=set)
    twice: set[int] = field(default_factory=set)
    late: set[int] = field(default_factory=set)


class FaultProxy:
    """Forwards a publisher's batches to the watcher, doing to them what the plan says."""

    def __init__(self, upstream: str, downstream: str, plan: Plan, epoch_of: Callable[[], int] = lambda: 0):
        ctx = zmq.Context.instance()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        # small buffers: a paused proxy makes the publisher drop all but a few hundred batches at most
        self.sub.setsockopt(zmq.RCVHWM, 50)
        self.sub.setsockopt(zmq.RCVBUF, 4096)
        self.sub.connect(upstream)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(downstream)
        self.plan, self.epoch_of = plan, epoch_of
        self.received: list[int] = []
        self.forwarded: list[int] = []
        self.dropped: list[int] = []
        self.running = True
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        held: list[list[bytes]] = []
        while self.running:
            if self.paused.is_set():
                time.sleep(0.005)
                continue
            if not self.sub.poll(20):
                continue
            frames = self.sub.recv_multipart()
            seq = int.from_bytes(frames[1], "big")
            self.received.append(seq)
            if self.epoch_of() == 0 and seq in self.plan.drop:
                self.dropped.append(seq)
                continue
            if self.epoch_of() == 0 and seq in self.plan.late:
                held.append(frames)
                continue
            self._send(frames, seq)
            if self.epoch_of() == 0 and seq in self.plan.twice:
                self._send(frames, seq)
            while held:
                late = held.pop(0)
                self._send(late, int.from_bytes(late[1], "big"))

    def _send(self, frames: list[bytes], seq: int) -> None:
        self.pub.send_multipart(frames)
        self.forwarded.append(seq)

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sub.close(linger=0)
        self.pub.close(linger=0)


class Workload:
    """A pool driven step by step: requests sharing prefixes cached, freed, evicted; a reset now and then.
    ``step()`` returns the step's events (vLLM's fields); ``pool`` may be any BlockPool (kvpool's or
    vLLM's, or a seeded bug's subclass) with ``make_request`` building requests it accepts."""

    def __init__(self, pool: Any, make_request: Callable[[str, list[int]], Any], block_size: int,
                 seed: int = 0, reset_every: int = 0):
        import random

        self.pool, self.make, self.block_size = pool, make_request, block_size
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(50) for _ in range(block_size * 3)] for _ in range(4)]
        self.running: list[tuple[Any, list[Any]]] = []
        self.steps, self.reset_every = 0, reset_every

    def step(self) -> list[Any]:
        """One step; the events the pool emitted (its own event objects, vLLM's or kvpool's)."""
        self.steps += 1
        rng, bs, pool = self.rng, self.block_size, self.pool
        if self.reset_every and self.steps % self.reset_every == 0:
            for _, blocks in self.running:
                pool.free_blocks(reversed(blocks))
            self.running.clear()
            pool.reset_prefix_cache()
        elif self.running and (rng.random() < 0.4 or len(self.running) > 4):
            _, blocks = self.running.pop(rng.randrange(len(self.running)))
            pool.free_blocks(reversed(blocks))
        else:
            tokens = rng.choice(self.prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 3 * bs))]
            req = self.make(f"r{self.steps}", tokens)
            n = len(tokens) // bs
            if n and pool.get_num_free_blocks() > n:
                blocks = pool.get_new_blocks(n)
                pool.cache_full_blocks(req, blocks, 0, n, bs, 0)
                self.running.append((req, blocks))
        return list(pool.take_events())


def kvpool_workload(seed: int = 0, pool_class: type = BlockPool, reset_every: int = 0,
                    block_size: int = 4) -> Workload:
    hasher = get_request_block_hasher(block_size)
    pool = pool_class(num_gpu_blocks=48, enable_caching=True, hash_block_size=block_size,
                      enable_kv_cache_events=True)
    return Workload(pool, lambda rid, toks: Request(rid, toks, block_hasher=hasher), block_size, seed,
                    reset_every)


def publish_steps(publisher: Any, workload: Workload, steps: int, publish: Callable[[Any, list[Any]], int]
                  ) -> dict[int, list[dict[str, Any]]]:
    """Run ``steps`` workload steps, publishing each step's events as one batch; the batches by seq,
    their events as dicts."""
    out = {}
    for _ in range(steps):
        events = workload.step()
        out[publish(publisher, events)] = [event_fields(e) for e in events]
    return out


def publish_json(publisher: Publisher, events: list[Any], rank: int | None = None) -> int:
    """Publish a batch of event objects (or dicts) through the protocol-speaking :class:`Publisher`."""
    dicts = [e if isinstance(e, dict) else event_fields(e) for e in events]
    return publisher.publish(encode_batch(dicts, time.time(), rank))


BAD_PARENT = 0xBAD0BAD0BAD0BAD0
"""The parent the seeded bug announces: never stored by anyone."""


def wrong_parent(base: type, at: int) -> type:
    """A pool (any BlockPool class) whose ``at``-th store of blocks names a parent never stored."""

    class WrongParent(base):  # type: ignore[misc, valid-type]
        stores = 0

        def cache_full_blocks(self, *args: Any, **kw: Any) -> None:
            before = len(self.kv_event_queue)
            super().cache_full_blocks(*args, **kw)
            for e in self.kv_event_queue[before:]:
                if type(e).__name__ == "BlockStored" and e.block_hashes:
                    self.stores += 1
                    if self.stores == at:
                        e.parent_block_hash = BAD_PARENT

    return WrongParent


def seeded_at(batches: dict[int, list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """(seq, event index) of every store the seeded bug made."""
    return [(seq, i) for seq, events in batches.items() for i, e in enumerate(events)
            if e.get("parent_block_hash") == BAD_PARENT]

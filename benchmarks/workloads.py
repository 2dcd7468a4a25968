"""The two workloads ``pool_throughput.py`` and ``pool_profile.py`` play against a block pool.

Each is a scheduler that drives any pool with vLLM's API through ``call(op, nblocks,
method, *args)``, where ``op`` is the operation class the call is counted in and
``nblocks`` the blocks it moves.  The pools behave identically, so a workload makes
the same calls on every pool; the harness checks that, records the calls once and
replays them.

* ``mixed``: requests sharing a few long system prompts, whole prompts admitted in one
  step, blocks freed at random: lookups that hit and miss, allocation with lazy
  evictions once the pool is full of cached blocks, caching of full prompt blocks.
* ``serving``: continuous batching with chunked prefill and decode, as vLLM's scheduler
  runs it: multi-turn chats whose every turn re-reads its whole history (long prompts,
  many prefix hits), many short one-off requests, some with a LoRA adapter or a cache
  salt (extra keys in every event), a few reporting their hits (``kv_cache_report_mode``
  full: ``emit_cached_block_events``), a pool small enough that most allocations evict
  cached blocks, preemption when it runs dry, one block allocated and one cached per
  16 decoded tokens, events taken every step.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.impl.request import LoRARequest

BLOCK_SIZE = 16

Call = Callable[..., Any]
"""``call(op, nblocks, method, *args)``: run ``method(*args)``, counted in class ``op``."""


# The LoRA fields a block pool reads (vLLM's LoRARequest has the same): kvpool's stand-in.
LoRA = LoRARequest


@dataclass
class Req:
    """The request attributes a block pool reads (vLLM's Request has the same)."""

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[bytes]
    lora_request: Any = None
    mm_features: list[Any] = field(default_factory=list)
    cache_salt: str | None = None
    session_id: str | None = None
    prompt_embeds: Any = None
    _prompt_embeds_per_block_hashes: dict[Any, Any] = field(default_factory=dict)


def chain(tokens: list[int], root: bytes = b"root") -> list[bytes]:
    """One chained hash per full block; ``root`` stands for what else enters the hash."""
    out: list[bytes] = []
    parent = root
    for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hashlib.sha256(parent + repr(tokens[i:i + BLOCK_SIZE]).encode()).digest()
        out.append(parent)
    return out


def prefix_hits(pool: Any, hashes: list[bytes], call: Call) -> list[Any]:
    """The cached blocks of the longest prefix of ``hashes`` the pool holds, one lookup each."""
    hits: list[Any] = []
    for h in hashes:
        found = call("lookup", 1, pool.get_cached_block, h, [0])
        if found is None:
            break
        hits.append(found[0])
    return hits


# ------------------------------------------------------------------------ mixed


def mixed_requests(n: int, seed: int) -> list[Req]:
    """Requests = one of a few long system prompts + a user turn of its own."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(32000) for _ in range(rng.randint(256, 1024))] for _ in range(12)]
    reqs = []
    for i in range(n):
        tokens = rng.choice(prompts) + [rng.randrange(32000) for _ in range(rng.randint(16, 400))]
        reqs.append(Req(f"r{i}", tokens, chain(tokens)))
    return reqs


def mixed(pool: Any, reqs: list[Req], seed: int, call: Call, max_running: int = 64) -> None:
    """Admit, decode and finish requests like a scheduler."""
    rng = random.Random(seed)
    running: list[list[Any]] = []
    for req in reqs:
        hits = prefix_hits(pool, req.block_hashes, call)
        if hits:
            call("touch", len(hits), pool.touch, hits)
        need = -(-len(req.all_token_ids) // BLOCK_SIZE) - len(hits)
        while need > pool.get_num_free_blocks() and running:
            blocks = running.pop(0)
            call("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
        if need > pool.get_num_free_blocks():
            if hits:
                call("free", len(hits), pool.free_blocks, hits)
            continue
        new = call("allocate", need, pool.get_new_blocks, need)
        blocks = hits + new
        full = len(req.block_hashes)
        call("cache", full - len(hits), pool.cache_full_blocks,
             req, blocks, len(hits), full, BLOCK_SIZE, 0)
        running.append(blocks)
        if len(running) > max_running or rng.random() < 0.3:
            blocks = running.pop(rng.randrange(len(running)))
            call("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
        if rng.random() < 0.05:
            call("events", 0, pool.take_events)
    for blocks in running:
        call("free", len(blocks), pool.free_blocks, list(reversed(blocks)))
    call("events", 0, pool.take_events)


# ---------------------------------------------------------------------- serving


@dataclass
class Turn:
    """One request of the serving workload: its prompt, then the tokens it decodes."""

    req: Req
    prompt: int
    output: int
    report_hits: bool
    follow: Turn | None = None  # the next turn of its chat, ready once this one finishes
    think: int = 0  # steps between this turn's end and the next turn's arrival


def serving_turns(n: int, seed: int) -> list[Turn]:
    """About ``n`` requests: multi-turn chats and short one-off requests, first turns only.

    A chat's turn k+1 is its turn k (prompt and answer) plus a new user message, so its
    prompt hits every block turn k cached; chats share four long system prompts.  A
    fifth of the conversations run a LoRA adapter, a tenth carry a cache salt (both
    enter the block hashes, so they hit only their own kind), a tenth report their hits.
    """
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(rng.randint(512, 2048))] for _ in range(4)]
    adapters = [LoRA(f"adapter-{i}", i + 1, f"/adapters/{i}") for i in range(3)]
    firsts: list[Turn] = []
    made = 0
    while made < n:
        lora = rng.choice(adapters) if rng.random() < 0.2 else None
        salt = f"tenant-{rng.randrange(3)}" if rng.random() < 0.1 else None
        report = rng.random() < 0.1
        root = f"root|{lora.lora_name if lora else ''}|{salt or ''}".encode()
        chat = rng.random() < 0.4
        history = list(rng.choice(systems)) if chat or rng.random() < 0.3 else []
        turns = rng.randint(2, 5) if chat else 1
        prev: Turn | None = None
        session = f"s{made}" if chat else None
        for _turn in range(turns):
            user = [rng.randrange(32000) for _ in range(rng.randint(*((30, 300) if chat else (8, 120))))]
            answer = [rng.randrange(32000) for _ in range(rng.randint(*((50, 400) if chat else (4, 60))))]
            tokens = history + user + answer
            req = Req(f"q{made}", tokens, chain(tokens, root), lora_request=lora, cache_salt=salt,
                      session_id=session)
            turn = Turn(req, len(history) + len(user), len(answer), report, think=rng.randint(1, 40))
            made += 1
            if prev is None:
                firsts.append(turn)
            else:
                prev.follow = turn
            prev = turn
            history = tokens
    return firsts


@dataclass
class _Running:
    turn: Turn
    blocks: list[Any]
    computed: int = 0  # tokens whose KV is computed
    cached: int = 0  # full blocks handed to cache_full_blocks

    def cache(self, pool: Any, call: Call) -> None:
        """Hand the blocks its computed tokens have filled since the last call to the cache."""
        full = self.computed // BLOCK_SIZE
        if full > self.cached:
            call("cache", full - self.cached, pool.cache_full_blocks,
                 self.turn.req, self.blocks, self.cached, full, BLOCK_SIZE, 0)
            self.cached = full


def serving(pool: Any, firsts: list[Turn], seed: int, call: Call, max_running: int = 32,
            token_budget: int = 2048, arrival: float = 0.35) -> None:
    """Continuous batching: running requests first (decode or the next prefill chunk), then admissions."""
    rng = random.Random(seed)
    arriving = deque(firsts)
    waiting: deque[Turn] = deque()
    later: list[tuple[int, Turn]] = []  # (step it arrives, follow-up turn)
    running: list[_Running] = []
    step = 0
    while arriving or waiting or later or running:
        step += 1
        while arriving and (rng.random() < arrival or not (waiting or running or later)):
            waiting.append(arriving.popleft())
        ready = [t for s, t in later if s <= step]
        later = [(s, t) for s, t in later if s > step]
        waiting.extend(ready)
        budget = token_budget
        for r in list(running):
            if r not in running or budget <= 0:
                continue  # preempted earlier in this step, or out of budget
            turn = r.turn
            chunk = min(turn.prompt - r.computed, budget) if r.computed < turn.prompt else 1
            need = -(-(r.computed + chunk) // BLOCK_SIZE) - len(r.blocks)
            while need > pool.get_num_free_blocks() and running[-1] is not r:
                victim = running.pop()  # preempt the newest: it gives its blocks back, recomputes later
                call("free", len(victim.blocks), pool.free_blocks, list(reversed(victim.blocks)))
                waiting.appendleft(victim.turn)
            if need > pool.get_num_free_blocks():
                continue
            if need > 0:
                r.blocks += call("allocate", need, pool.get_new_blocks, need)
            r.computed += chunk
            budget -= chunk
            r.cache(pool, call)
            if r.computed >= turn.prompt + turn.output:
                running.remove(r)
                call("free", len(r.blocks), pool.free_blocks, list(reversed(r.blocks)))
                if turn.follow is not None:
                    later.append((step + turn.think, turn.follow))
        while waiting and budget > 0 and len(running) < max_running:
            turn = waiting[0]
            req = turn.req
            # the last token is always computed
            hits = prefix_hits(pool, req.block_hashes[:(turn.prompt - 1) // BLOCK_SIZE], call)
            computed = len(hits) * BLOCK_SIZE
            chunk = min(turn.prompt - computed, budget)
            need = -(-(computed + chunk) // BLOCK_SIZE) - len(hits)
            idle_hits = sum(1 for b in hits if b.ref_cnt == 0)  # touching them takes them off the free queue
            if need + idle_hits > pool.get_num_free_blocks():
                break  # as vLLM: it waits, and looks its prefix up again next step
            waiting.popleft()
            if hits:
                call("touch", len(hits), pool.touch, hits)
            if hits and turn.report_hits:
                call("emit", len(hits), pool.emit_cached_block_events, req, len(hits), BLOCK_SIZE, 0)
            r = _Running(turn, hits + call("allocate", need, pool.get_new_blocks, need), computed + chunk,
                         len(hits))
            budget -= chunk
            r.cache(pool, call)
            running.append(r)
        call("events", 0, pool.take_events)


# ------------------------------------------------------------------------ table


@dataclass(frozen=True)
class Workload:
    """A workload's name, how to make its requests, and its scheduler."""

    name: str
    make: Callable[[int, int], Any]
    drive: Callable[[Any, Any, int, Call], None]
    default_requests: int
    default_blocks: int


WORKLOADS: dict[str, Workload] = {
    "mixed": Workload("mixed", mixed_requests, mixed, 3000, 8192),
    "serving": Workload("serving", serving_turns, serving, 2000, 4096),
}


def add_options(ap: argparse.ArgumentParser, every: bool = False) -> None:
    """What every script playing these workloads asks: which one (``every``: or all), how many
    requests on how many blocks, the seed, and whether KV events are off."""
    ap.add_argument("--workload", choices=[*WORKLOADS, *(["all"] if every else [])], default="mixed")
    ap.add_argument("--requests", type=int, default=0, help="default: the workload's own")
    ap.add_argument("--blocks", type=int, default=0, help="default: the workload's own")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-events", action="store_true", help="KV events off in every pool")

"""Delta debugging of a divergence over the calls of a run, each cut replayed on fresh pools.

A campaign run is long (thousands of calls) and random: its failure, as the
last calls before the difference, rarely shows why.  :func:`shrink_log` cuts
the run's calls (:class:`CallLog`, kept by the lockstep as they are made) to
a short list that still diverges the same way: every candidate is replayed on
a fresh pool and a fresh model of the run's shape, compared after every call,
and kept when it diverges at the same operation in the same parts (and, for
a pool that does not refuse misuse, without any call the model refuses but
for lack of blocks: such a call is no longer a legal one).  Block ids are
followed to the call that handed them out (:func:`renamed`), so a later call
keeps naming "the second block that allocation returned" when an earlier
call is cut.

The same :func:`ddmin` shrinks a driven pool's trace lines
(:mod:`.drive.failure`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.model import OPERATIONS, QUERIES, Refusal, RefusalKind

from ..core.lockstep import CallerBrokeContract, Divergence, Lockstep, Watcher, short_args
from ..generate.two_pools import free_across

Lines = list[dict[str, Any]]

MAX_REPLAYS = 400
"""Most replays one shrink makes (each a fresh pool and a run of calls)."""
MAX_COMPARED = 2_000_000
"""Most work one shrink does in all, in blocks compared: every replayed call compares the whole
pool, so a call counts as many as the first pool's blocks (200,000 calls on 10 blocks; a 10,000-call
long-lived run on 256 blocks is over it by itself, and is reported unshrunk)."""

HANDS_OUT = tuple(n for n, op in OPERATIONS.items() if op.result in ("blocks", "blocks?"))
"""The operations whose result names blocks a later call may name."""
BLOCK_ARGS = tuple(dict.fromkeys(a.name for op in OPERATIONS.values() for a in op.args
                                 if a.kind in ("block", "blocks", "block_ids")))
"""Every argument that names blocks by id."""
LISTS_OF_HELD = tuple(n for n, op in OPERATIONS.items()
                      if op.role == "action" and op.args and op.args[0].kind in ("blocks", "block_ids"))
"""Operations whose block list a shrink may cut: blocks the caller holds or names, in any number."""


def ddmin(lines: Lines, differs: Callable[[Lines], Lines | None], track: list[Lines] | None = None) -> Lines:
    """Delta debugging by complements: drop ever smaller chunks while the difference stays.

    ``differs`` replays a candidate and returns the lines answered (the new
    current list) or None; ``track[0]``, when given, follows the current list.
    """
    chunks = 2
    while len(lines) >= 2:
        size = -(-len(lines) // chunks)
        for start in range(0, len(lines), size):
            got = differs(lines[:start] + lines[start + size:])
            if got is not None:
                lines, chunks = got, max(chunks - 1, 2)
                if track is not None:
                    track[0] = lines
                break
        else:
            if size == 1:
                break
            chunks = min(2 * chunks, len(lines))
    return lines


def sources(lines: Sequence[dict[str, Any]]) -> list[dict[tuple[str, int], tuple[int, int]]]:
    """Per line, per block argument (name, position in the list; 0 for one id): the call whose
    result last handed out that id, and the position there (ids counted per ``pool``, if named)."""
    latest: dict[tuple[Any, int], tuple[int, int]] = {}
    out = []
    for i, line in enumerate(lines):
        args = line["args"] if isinstance(line["args"], dict) else {}
        pool = line.get("pool")
        here: dict[tuple[str, int], tuple[int, int]] = {}
        for name in BLOCK_ARGS:
            value = args.get(name)
            for k, b in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(b, int) and (pool, b) in latest:
                    here[name, k] = latest[pool, b]
        out.append(here)
        result = line.get("result")
        if line["op"] in HANDS_OUT and line.get("error") is None and isinstance(result, list):
            for k, b in enumerate(result):
                latest[pool, b] = (i, k)
    return out


def renamed(args: dict[str, Any], sources: dict[tuple[str, int], tuple[int, int]],
            handed: dict[int, list[int]], droppable: bool = False) -> dict[str, Any]:
    """``args`` with each block id that came from a replayed call replaced by what it gave now.

    With ``droppable`` (a list of blocks the caller holds), an id whose call
    was left out is left out too: the caller never got that block.
    """
    gone = object()

    def now(name: str, k: int, b: Any) -> Any:
        src = sources.get((name, k))
        if src is None:
            return b
        if src[0] not in handed:
            return gone if droppable else b
        return handed[src[0]][src[1]] if src[1] < len(handed[src[0]]) else b

    for name in BLOCK_ARGS:
        value = args.get(name)
        if isinstance(value, list):
            args[name] = [v for k, b in enumerate(value) if (v := now(name, k, b)) is not gone]
        elif name in args:
            args[name] = now(name, 0, value)
    return args


# ------------------------------------------------------------------ a run's calls


@dataclass
class CallLog:
    """Every call of a run, as made: where a shrink starts.

    Each entry is ``{"pool": 0 | 1, "op", "args": {name: value}, "tokens": {name: n},
    "result", "error"}`` (a request argument with its length then, since a
    request grows); a ``free_blocks`` through the first pool listing blocks of
    both pools is ``{"pool": 0, "op": "free_across", "listed": [(pool, id), ...]}``.
    ``fresh`` builds the run's first pool and model again, ``second`` its second.
    """

    fresh: Callable[[], Lockstep]
    second: Callable[[], Lockstep] | None = None
    misuse: bool = True
    entries: Lines = field(default_factory=list)
    step: int = 0
    """The workload step the calls now made belong to (a shrink first cuts whole steps)."""
    blocks: int = 1
    """The first pool's blocks: what each replayed call's whole-pool comparison costs."""
    _sources: list[dict[tuple[str, int], tuple[int, int]]] = field(default_factory=list, repr=False)

    def sources(self) -> list[dict[tuple[str, int], tuple[int, int]]]:
        """Per entry, where each block id it names was handed out (:func:`sources`), made once."""
        if len(self._sources) != len(self.entries):
            self._sources = sources(self.entries)
        return self._sources

    def add(self, pool: int, op: str, args: Sequence[Any], result: Any, error: str | None) -> None:
        decl = OPERATIONS[op]
        named: dict[str, Any] = {a.name: (list(v) if isinstance(v, list) else v)
                                 for a, v in zip(decl.args, args, strict=False)}
        tokens = {n: v.num_tokens for n, v in named.items() if hasattr(v, "request_id")}
        self.entries.append({"pool": pool, "op": op, "args": named, "tokens": tokens, "step": self.step,
                             "result": list(result) if isinstance(result, list) else result,
                             "error": error, "extra": list(args[len(decl.args):])})

    def add_across(self, listed: Sequence[tuple[int, int]]) -> None:
        mine = [b for p, b in listed if p == 0]
        self.entries.append({"pool": 0, "op": "free_across", "args": {"block_ids": mine}, "step": self.step,
                             "listed": list(listed), "tokens": {}, "result": None, "error": None})


@dataclass
class Replay:
    """One replay of entries on fresh pools: where it diverged, and each call as it went."""

    divergence: Divergence | None
    at: int
    """The index of the entry that diverged (the number of entries run when none did)."""
    lines: list[str]
    refused: set[str]
    """The model's refusals seen, by name (a misuse, unless out of blocks)."""


def replay(log: CallLog, entries: Lines) -> Replay:
    """``entries`` (some of ``log``'s, in order) on fresh pools, the whole pool compared after
    every call; each block id followed to the call of the run that handed it out (:func:`renamed`)."""
    pairs: dict[int, Lockstep] = {}
    at = {id(e): i for i, e in enumerate(log.entries)}
    srcs = log.sources()
    handed: dict[int, list[int]] = {}
    requests: dict[int, Any] = {}
    lines: list[str] = []
    refused: set[str] = set()

    def pair_of(pool: int) -> Lockstep:
        if pool not in pairs:
            make = log.second if pool else log.fresh
            if make is None:
                raise ValueError("the run had no second pool")
            pairs[pool] = make()
            pairs[pool].full_every = 1
        return pairs[pool]

    first = pair_of(0)
    for i, entry in enumerate(entries):
        pair = pair_of(entry["pool"])
        args = renamed(dict(entry["args"]), srcs[at[id(entry)]], handed,
                       droppable=entry["op"] in LISTS_OF_HELD)
        try:
            if entry["op"] == "free_across":
                mine = iter(args["block_ids"])
                listed = [(pair_of(p), next(mine, b) if p == 0 else b) for p, b in entry["listed"]]
                free_across(first, pair_of(1), listed)
                result: Any = None
            else:
                values = [_replayed(v, entry["tokens"].get(n), requests, pair) for n, v in args.items()]
                result = pair.call(entry["op"], *values, *entry.get("extra", ()))
        except CallerBrokeContract:
            return Replay(None, i, lines, {"contract"})
        except Divergence as exc:
            lines.append(_line(entry, pair))
            return Replay(exc, i, lines, refused)
        except Exception as exc:  # the pool failed outside a call (a process that died between)
            return Replay(_failed(exc, entry["op"], pair), i, lines, refused)
        if isinstance(result, Refusal):
            refused.add(result.kind.name)
        lines.append(_line(entry, pair))
        if entry["op"] in HANDS_OUT and isinstance(result, list):
            handed[at[id(entry)]] = result
    for pair in pairs.values():
        try:
            pair.check()
        except Divergence as exc:
            return Replay(exc, len(entries), lines, refused)
        except Exception as exc:
            return Replay(_failed(exc, "observation", pair), len(entries), lines, refused)
    return Replay(None, len(entries), lines, refused)


def _failed(exc: Exception, op: str, pair: Lockstep) -> Divergence:
    """A failure of the pool outside a call's comparison, as the divergence a replay found: a pool
    process's verdict (parts ``process``), or any other exception of the pool (``crash``)."""
    process = getattr(exc, "verdict", None) is not None
    return pair._diverged(op, str(exc).splitlines()[0] if process else f"{type(exc).__name__}: {exc}",
                          ["process" if process else "crash"], exc)


def _replayed(value: Any, tokens: int | None, requests: dict[int, Any], pair: Lockstep) -> Any:
    """An argument for the replay: a request as long as it was then, a watcher of the new pool."""
    if isinstance(value, Watcher):
        return pair.watcher(value.name)
    if tokens is None or getattr(value, "block_hasher", None) is None:
        return list(value) if isinstance(value, list) else value
    again = requests.get(id(value))
    if again is None:
        again = requests[id(value)] = type(value)(
            value.request_id, value.all_token_ids[:tokens], lora_request=value.lora_request,
            mm_features=list(value.mm_features), cache_salt=value.cache_salt,
            session_id=value.session_id, block_hasher=value.block_hasher)
    if again.num_tokens < tokens:
        again.append_output_token_ids(value.all_token_ids[again.num_tokens:tokens])
    return again


def _line(entry: dict[str, Any], pair: Lockstep) -> str:
    """The call as the shrunk trace shows it: the lockstep's own record of it."""
    where = "second pool: " if entry["pool"] == 1 else ""
    shown = pair.trace[-1].shown if pair.trace else f"{entry['op']}{short_args(entry['args'].values())}"
    return where + shown


@dataclass
class Shrunk:
    """A shrunk divergence: the calls kept, printed, and how many there were."""

    lines: list[str]
    before: int
    after: int
    divergence: Divergence | None
    replays: int
    note: str = ""
    requests: list[str] = field(default_factory=list)
    """The requests the kept calls name, each with what it reads (tokens and extra keys)."""

    @classmethod
    def unshrunk(cls, log: CallLog, replays: int, note: str) -> Shrunk:
        """The run's calls left as they were, and why."""
        return cls([], len(log.entries), len(log.entries), None, replays, note=f"not shrunk: {note}")


def signature(exc: Divergence) -> tuple[str, tuple[str, ...]]:
    """What a divergence is, for keeping it while shrinking: the diverging call's operation and
    the parts that differed."""
    op = exc.record[-1].op if exc.record else ""
    return op, tuple(sorted(exc.parts))


def shrink_log(log: CallLog, on_kept: Callable[[Lines], object] | None = None) -> Shrunk:
    """The fewest calls of ``log`` found that diverge as the whole run does (see the module docstring).

    ``on_kept`` is told the entries kept (a test replays them on another pool)."""
    try:
        return _shrink(log, on_kept)
    except Exception as exc:  # the pool failing while the shrink makes pools (a process at its end)
        return Shrunk.unshrunk(log, 0, f"a replay failed before its calls ({str(exc).splitlines()[0]})")


def _shrink(log: CallLog, on_kept: Callable[[Lines], object] | None) -> Shrunk:
    blocks = log.blocks
    if len(log.entries) * blocks > MAX_COMPARED:
        return Shrunk.unshrunk(log, 0, f"replaying the run's {len(log.entries):,} calls on {blocks:,} "
                               f"blocks, the whole pool compared after each, is over the shrink's budget "
                               f"({MAX_COMPARED:,} blocks compared)")
    whole = replay(log, log.entries)
    if whole.divergence is None:
        return Shrunk.unshrunk(log, 1, "the run's calls replayed on fresh pools do not diverge")
    target = signature(whole.divergence)
    budget = {"replays": 1, "compared": len(log.entries) * blocks}

    def judged(kept: Lines) -> Lines | None:
        cost = len(kept) * blocks
        if budget["replays"] >= MAX_REPLAYS or budget["compared"] + cost > MAX_COMPARED:
            return None
        budget["replays"] += 1
        budget["compared"] += cost
        try:
            got = replay(log, kept)
        except Exception:  # its pools could not be made (a process failing at a header): not kept
            return None
        misuse = {k for k in got.refused if k != RefusalKind.NOT_ENOUGH_FREE_BLOCKS.name}
        if got.divergence is None or signature(got.divergence) != target or (misuse and not log.misuse):
            return None
        return kept[:got.at + 1]

    kept = log.entries[: whole.at + 1]
    calls = [e for e in kept[:-1] if e["op"] not in QUERIES and e["op"] != "take_events"] + kept[-1:]
    kept = (judged(calls) if len(calls) < len(kept) else None) or kept
    steps: dict[int, Lines] = {}
    for e in kept:
        steps.setdefault(e["step"], []).append(e)
    if len(steps) > 2:  # whole workload steps first: a request's calls of one step go together
        units = ddmin([{"op": "step", "args": {}, "calls": c} for c in steps.values()],
                      lambda cut: _units(judged([e for u in cut for e in u["calls"]]), cut))
        kept = [e for u in units for e in u["calls"]]
    kept = ddmin(kept, judged)
    if on_kept is not None:
        on_kept(kept)
    final = replay(log, kept)
    return Shrunk(final.lines, len(log.entries), len(kept), final.divergence or whole.divergence,
                  budget["replays"] + 1, requests=_requests(kept))


def _units(kept: Lines | None, units: Lines) -> Lines | None:
    """The units (workload steps) whose calls ``kept`` begins with, or None."""
    if kept is None:
        return None
    out, n = [], 0
    for u in units:
        if n >= len(kept):
            break
        out.append(u)
        n += len(u["calls"])
    return out


def _requests(entries: Lines) -> list[str]:
    """Each request the entries name, once: its id, its tokens at its longest, its extra keys."""
    seen: dict[str, str] = {}
    longest: dict[str, int] = {}
    for e in entries:
        for name, value in e["args"].items():
            if not hasattr(value, "request_id"):
                continue
            n = e["tokens"].get(name, value.num_tokens)
            if n < longest.get(value.request_id, -1):
                continue
            longest[value.request_id] = n
            extras = [f"lora {value.lora_request.name!r}"] if getattr(value, "lora_request", None) else []
            extras += [f"{label} {v!r}" for label, name in (("salt", "cache_salt"), ("session", "session_id"))
                       if (v := getattr(value, name, None))]
            items = [(f.mm_position.offset, f.mm_position.length) for f in getattr(value, "mm_features", ())]
            extras += [f"items (offset, length) {items}"] if items else []
            seen[value.request_id] = (f"{value.request_id}: tokens {value.all_token_ids[:n]}"
                                      + "".join(f", {x}" for x in extras))
    return list(seen.values())


__all__ = ["BLOCK_ARGS", "HANDS_OUT", "LISTS_OF_HELD", "MAX_COMPARED", "MAX_REPLAYS", "CallLog", "Replay",
           "Shrunk", "ddmin", "renamed", "replay", "shrink_log", "signature", "sources"]

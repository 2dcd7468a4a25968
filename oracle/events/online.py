"""One engine's KV-event stream checked event by event: the rules and the warnings, in bounded memory.

This is the one implementation of ``check-events``' rules (:mod:`.kinds` names
them): a file is fed to it line by line, a live engine batch by batch, and both
get the same findings at the same positions.  It keeps, per ``(hash, group)``
key, the copies stored and not removed since the last ``AllBlocksCleared``
(with the medium and adapter of the last store), and forgets in bounded ways:

* a key removed to no copy is kept for the last ``history`` such keys (to
  tell "removed more often than stored" from "never stored", and a removed
  parent from an unknown one);
* a key stored more often than removed (a re-announced hit, or a second copy:
  the stream does not say which) may be a phantom the engine no longer holds;
  the ``history`` least recently touched such keys are kept, older ones
  forgotten;
* a forgotten key goes into a fixed-size Bloom filter (1 MiB): a later event
  naming a key the filter may hold is *not judged* (counted, never a false
  violation); the filter saturates rather than grows, so in a very long run
  without ``AllBlocksCleared`` less is judged, never wrongly.

Memory is then the live keys (the engine's index, plus the phantoms kept)
and ``history``, whatever the run's length.  After :meth:`StreamChecker.restart`
with ``known_empty=False`` (batches lost, or joined mid-stream) the checker
has a *horizon*: what was stored before it is unknown, so removals with no
copy seen (any key may hold copies stored before) and parents not stored
since are not judged, until the next ``AllBlocksCleared``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .kinds import LOW_64, Key, Position, Violation, hash64
from .kinds import key_text as _key

HISTORY = 65_536
"""Removed keys, and keys stored more often than removed, kept per engine (each of the two)."""
PENDING = 4_096
"""One-hash stores per group held until the group's full block size is known."""
_ODD_SIZES = 64

Copies = dict[Key, int]
Sink = Callable[[Violation], None]


class Facts(Protocol):
    """What a trace's replay says of a line: the pool's copies of the keys its stores name, before
    and after the call (:class:`~.warnings.PoolFacts`)."""

    def at(self, line: int) -> tuple[Copies, Copies] | None: ...


_Held = list[Any]
"""One key's copies, a list (one is made per key stored: a list is the cheapest object), indexed by:"""
COUNT, ATTRS, BLIND, MEDIA = 0, 1, 2, 3
"""How many copies; the (medium, lora_name, lora_id) of its last store that said them; whether its chain
rests on state the checker cannot see; its copies per medium, once they are in two."""


def _held() -> _Held:
    return [0, None, False, None]


class _Ghost:
    """A Bloom filter of forgotten keys: ``in`` may say yes for a key never added, never no for one added."""

    BITS = 1 << 23
    _MASK = BITS - 1

    def __init__(self) -> None:
        self.bits = bytearray(self.BITS >> 3)

    def _spots(self, key: Key) -> tuple[int, int, int]:
        x = (hash(key) * 0x9E3779B97F4A7C15) & LOW_64
        return x & self._MASK, (x >> 23) & self._MASK, (x >> 41) & self._MASK

    def add(self, key: Key) -> None:
        for s in self._spots(key):
            self.bits[s >> 3] |= 1 << (s & 7)

    def __contains__(self, key: Key) -> bool:
        return all(self.bits[s >> 3] >> (s & 7) & 1 for s in self._spots(key))


@dataclass
class _Pending:
    """A one-hash store whose group's full block size is not known yet."""

    position: Position
    group: int
    size: int
    orphan: str | None
    """The violation's message if its parent was never stored (it is one unless a partial entry)."""
    hidden: int
    """Blocks its group had skipped before it (one of them may be its parent)."""
    key: str


def _noop(_: Key) -> None:
    return None


class StreamChecker:
    """Reads one engine's events in order; reports violations and warnings through the two sinks."""

    def __init__(self, block_sizes: dict[int, int] | None = None, *, facts: Facts | None = None,
                 history: int = HISTORY, on_violation: Sink | None = None, on_warning: Sink | None = None,
                 retire: Callable[[Key], None] | None = None):
        self.declared = dict(block_sizes or {})
        self.facts = facts
        self.history = max(1, history)
        self.violations: list[Violation] = []
        self.warnings: list[Violation] = []
        self._violation = on_violation or self.violations.append
        self._warning = on_warning or self.warnings.append
        self.retire = retire or _noop
        self.events = self.reannounced = self.empty_stores = self.token_mismatches = 0
        self.unverified_parents = self.unjudged = self.forgotten = 0
        self.snapshots = self.phantoms = 0
        self.pending: dict[int, deque[_Pending]] = {}
        self._fresh(None)

    def _fresh(self, horizon: Position | None) -> None:
        self._reset_keys(horizon)
        self.full: dict[int, int] = dict(self.declared)
        self.first_size: dict[int, int] = {}
        self.largest: dict[int, int] = {}
        """Per group: the largest block size its stores showed (what a router may be configured with)."""
        self.partial: dict[int, int] = {}
        self.odd: set[tuple[int, int]] = set()
        self.grouped = self.ungrouped = 0

    def _reset_keys(self, horizon: Position | None) -> None:
        self.live: dict[Key, _Held] = {}
        # FIFOs whose oldest goes as a new one comes: an OrderedDict finds its first entry at once,
        # where a dict skips every entry deleted before it (per event, as many as the history holds)
        self.gone: OrderedDict[Key, _Held] = OrderedDict()
        self.ambiguous: OrderedDict[Key, None] = OrderedDict()
        """Live keys stored more often than removed since they last had no copy, least recent first."""
        self.ghost: _Ghost | None = None
        self.groups: dict[Any, list[int]] = {}
        """Per hash with copies: the groups holding it."""
        self.media: dict[Any, int] = {}
        """Copies held per medium."""
        self.hidden: dict[int, int] = {}
        """Per group: blocks skipped in stores (null or masked) since the last clear, whose hashes a
        later store may name as its parent, never announced."""
        self.horizon = horizon

    # ------------------------------------------------------------------ the stream

    def feed(self, event: dict[str, Any], pos: Position) -> bool:
        """Apply one validated event.  True when it rests on state the checker cannot see (before a
        horizon, or forgotten): what it names is not judged, and a router's reaction to it neither."""
        self.events += 1
        kind = event["type"]
        if kind != "BlockRemoved" and kind != "BlockStored":
            self._cleared(pos)
            return False
        group = event.get("group_idx")
        if type(group) is int and not self.ungrouped:  # _group's common case, without the call
            self.grouped += 1
        else:
            group = self._group(event, pos)
        if kind == "BlockRemoved":
            return self._removed(event, group, pos)
        return self._stored(event, group, pos)

    def _warn(self, rule: str, pos: Position, message: str) -> None:
        self._warning(Violation(rule, pos, message))

    def _group(self, event: dict[str, Any], pos: Position) -> int:
        """The event's KV-cache group; the stream's mix of events with and without one is warned of."""
        group = event.get("group_idx")
        if group is None:
            self.ungrouped += 1
            if self.grouped:
                self._warn("group-missing", pos, f"{event['type']} without group_idx, while earlier events "
                           "carried one: read as group 0, by the checker and every router profile")
            return 0
        if self.ungrouped and not self.grouped:
            self._warn("group-missing", pos, f"the {self.ungrouped} event(s) before this one carried no "
                       "group_idx and were read as group 0; this one says group "
                       f"{group}: the stream mixes both")
            self.ungrouped = 0
        self.grouped += 1
        return int(group)

    def _unknowable(self, key: Key) -> bool:
        return self.horizon is not None or (self.ghost is not None and key in self.ghost)

    def _cleared(self, pos: Position) -> None:
        held = sorted((m for m, n in self.media.items() if n > 0 and m is not None), key=str)
        if len(held) > 1:
            self._warn("clear-names-no-medium", pos, f"AllBlocksCleared while keys are held in media {held}: "
                       "it names no medium, and a router drops the keys of every one")
        for key in self.live:
            self.retire(key)
        self._reset_keys(None)

    def _removed(self, event: dict[str, Any], group: int, pos: Position) -> bool:
        medium = event.get("medium")
        blind = False
        live = self.live
        for raw in event["block_hashes"]:
            key = (raw if type(raw) is int and raw >= 0 else hash64(raw), group)
            held = live.get(key)
            if held is None:
                twice = key in self.gone and self.horizon is None
                if not twice and self._unknowable(key):  # after a horizon, copies stored before it may remain
                    self.unjudged += 1
                    blind = True
                else:
                    self._violation(Violation("event_removals_name_live_keys", pos, f"BlockRemoved of "
                                              f"{_key(key)}: " + ("removed more often than stored" if twice
                                              else "never stored since the last AllBlocksCleared")))
                continue
            if medium is not None and held[ATTRS] is not None and held[ATTRS][0] is not None and not (
                    held[MEDIA].get(medium) if held[MEDIA] else held[ATTRS][0] == medium):
                said = sorted(held[MEDIA], key=str) if held[MEDIA] else [held[ATTRS][0]]
                self._warn("medium-mismatch", pos, f"BlockRemoved of {_key(key)} with medium {medium!r}: the "
                           f"copies the stream holds were stored with medium {', '.join(map(repr, said))}")
            blind = blind or held[BLIND]
            if held[COUNT] == 1 and held[MEDIA] is None:  # _take's common case: a key's one copy
                held[COUNT] = 0
                attrs = held[ATTRS]
                taken = attrs[0] if attrs is not None else None
                self.media[taken] = self.media.get(taken, 1) - 1
                self._gone(key, held)
            else:
                self._take(key, held, medium)
        return blind

    def _take(self, key: Key, held: _Held, medium: Any) -> None:
        held[COUNT] -= 1
        media = held[MEDIA]
        if media:
            taken = medium if media.get(medium) else next(iter(media))
            media[taken] -= 1
            if not media[taken]:
                del media[taken]
            if len(media) == 1:
                held[MEDIA] = None
        else:
            taken = held[ATTRS][0] if held[ATTRS] is not None else None
        self.media[taken] = self.media.get(taken, 1) - 1
        if not held[COUNT]:
            self._gone(key, held)
        elif key in self.ambiguous:
            self.ambiguous.move_to_end(key)

    def _gone(self, key: Key, held: _Held) -> None:
        """A key's last copy removed: kept among the removed, the oldest of those forgotten."""
        del self.live[key]
        self.ambiguous.pop(key, None)
        groups = self.groups.get(key[0])
        if groups is not None and len(groups) == 1 and groups[0] == key[1]:
            del self.groups[key[0]]  # the common case of _ungroup: the hash's one group
        else:
            self._ungroup(key)
        self.gone[key] = held
        if self.retire is not _noop:
            self.retire(key)
        if len(self.gone) > self.history:
            self._forget(self.gone.popitem(last=False)[0])

    def _ungroup(self, key: Key) -> None:
        h, group = key
        groups = self.groups.get(h)
        if groups is not None:
            if group in groups:
                groups.remove(group)
            if not groups:
                del self.groups[h]

    def _forget(self, key: Key) -> None:
        if self.ghost is None:
            self.ghost = _Ghost()
        self.ghost.add(key)
        self.forgotten += 1

    def _stored(self, event: dict[str, Any], group: int, pos: Position) -> bool:
        hashes = [h if type(h) is int and h >= 0 else hash64(h) for h in event["block_hashes"]]
        n, size, tokens = len(hashes), event["block_size"], event["token_ids"]
        if not n:
            self.empty_stores += 1
            self._warn("empty-store", pos, f"BlockStored with no hash and {len(tokens)} token(s): every "
                       "block of the range was null or masked")
        elif len(tokens) != size * n and size:
            self.token_mismatches += 1
            self._warn("tokens-not-filling", pos, f"BlockStored of {n} hash(es) of block_size {size} carries "
                       f"{len(tokens)} token_ids, not {size * n}: null or masked blocks are skipped in the "
                       "hashes, not in the tokens")
        parent = event.get("parent_block_hash")
        pkey = None if parent is None or not n else (hash64(parent), group)
        if (n > 1 and len(set(hashes)) < n) or (pkey is not None and pkey[0] in hashes):
            twice = sorted({f"{h:#018x}" if isinstance(h, int) else str(h) for h in hashes
                            if hashes.count(h) > 1 or (pkey is not None and h == pkey[0])})
            self._violation(Violation("hash-repeated", pos, f"BlockStored names {', '.join(twice)} twice "
                                      "(among its hashes and its parent): a chain that contains itself"))
        extra, ahead = event.get("extra_keys"), event.get("lookahead_token_ids")
        if (extra is not None and len(extra) != n) or (ahead is not None and len(ahead) != n):
            self._per_hash(event, n, pos)
        shape = self._shape(group, size, n, pos)
        said = "medium" in event
        attrs = (event.get("medium"), event.get("lora_name"), event.get("lora_id")) if said else None
        facts = self.facts.at(pos.line) if self.facts is not None else None
        before, after = facts if facts is not None else (None, None)
        orphan, blind = None, False
        if pkey is not None:
            orphan, blind = self._parent(pkey, (hashes[0], group), pos, attrs, before)
        hidden = self.hidden.get(group, 0)
        if shape == "partial":
            self._partial(pos, size, self.full[group], _key((hashes[0], group)), orphan is not None)
        elif shape == "full":
            if orphan is not None:
                self._orphan(pos, orphan, hidden)
        else:
            self._hold(group, _Pending(pos, group, size, orphan, hidden, _key((hashes[0], group))))
        if size > 0 and len(tokens) // size > n:
            self.hidden[group] = self.hidden.get(group, 0) + len(tokens) // size - n
        live, gone, groups = self.live, self.gone, self.groups
        for h in hashes:
            key = (h, group)
            if before is None and key not in live and key not in gone and h not in groups:
                live[key] = [1, attrs, blind, None]  # the common case: a key and a hash new to the stream
                groups[h] = [group]
            else:
                self._add(key, pos, attrs, blind, before, after)
                continue
            medium = attrs[0] if attrs is not None else None
            self.media[medium] = self.media.get(medium, 0) + 1
        return blind

    def _per_hash(self, event: dict[str, Any], n: int, pos: Position) -> None:
        for name, rule in (("extra_keys", "extra-keys-not-per-hash"),
                           ("lookahead_token_ids", "lookahead-not-per-hash")):
            per = event.get(name)
            if per is not None and len(per) != n:
                self._warn(rule, pos, f"BlockStored of {n} hash(es) with {len(per)} {name} entr(ies): "
                           "one per hash is what a router pairs them by")

    def _parent(self, pkey: Key, first: Key, pos: Position, attrs: tuple[Any, Any, Any] | None,
                before: Copies | None) -> tuple[str | None, bool]:
        """The parent's standing: the violation's message if it was never stored, and whether the
        store rests on state the checker cannot see."""
        held = self.live.get(pkey)
        known = held if held is not None else self.gone.get(pkey)
        if known is None:
            if self._unknowable(pkey):
                self.unjudged += 1
                return None, True
            return (f"BlockStored of {_key(first)} names parent {_key(pkey)}, never stored in that group "
                    "since the last AllBlocksCleared"), False
        if (before.get(pkey, 0) if before is not None else (held[COUNT] if held else 0)) <= 0:
            self._warn("parent-removed", pos, f"BlockStored names parent {_key(pkey)}, stored since the "
                       "last AllBlocksCleared and removed since")
        last = known[ATTRS]
        if last is not None and attrs is not None:
            if last[0] != attrs[0]:
                self._warn("medium-change", pos, f"BlockStored with medium {attrs[0]!r} names parent "
                           f"{_key(pkey)}, stored with medium {last[0]!r}")
            if last[1:] != attrs[1:]:
                self._warn("lora-change", pos, f"BlockStored with LoRA {attrs[1]!r} names parent "
                           f"{_key(pkey)}, stored with LoRA {last[1]!r}")
        return None, known[BLIND]

    def _add(self, key: Key, pos: Position, attrs: tuple[Any, Any, Any] | None, blind: bool,
             before: Copies | None, after: Copies | None) -> None:
        held = self.live.get(key)
        medium = attrs[0] if attrs is not None else None
        if before is not None and after is not None:
            if before.get(key, 0) > 0:
                second = after.get(key, 0) > before[key]
                self._warn("second-copy" if second else "reannounced-hit", pos,
                           f"BlockStored of {_key(key)}, which the pool held {before[key]} cop(ies) of: "
                           + ("one more copy" if second else "no new copy: a prefix hit announced again"))
        elif held is not None:
            here = (held[MEDIA] if held[MEDIA] else {held[ATTRS][0] if held[ATTRS] else None: 1})
            if medium is not None and None not in here and medium not in here:
                held_in = ", ".join(map(repr, sorted(here, key=str)))
                self._warn("medium-copy", pos, f"BlockStored of {_key(key)} with medium {medium!r}, which "
                           f"the stream holds with medium {held_in}: one key in two tiers, that a router "
                           "keyed by the hash alone merges")
            else:
                self._warn("stored-again", pos, f"BlockStored of {_key(key)}, which the stream holds: a "
                           "prefix hit re-announced (no new copy) or a second copy; the stream does not "
                           "say which")
        if held is None:
            held = self.gone.pop(key, None) or _held()
            held[MEDIA] = None
            h, group = key
            others = self.groups.get(h)
            if others:
                self._warn("hash-in-two-groups", pos, f"BlockStored of {_key(key)}, a 64-bit hash group(s) "
                           f"{sorted(others)} hold too")
                others.append(group)
            else:
                self.groups[h] = [group]
            self.live[key] = held
        else:
            self.reannounced += 1
            was = held[ATTRS][0] if held[ATTRS] is not None else None
            if held[MEDIA] is not None or was != medium:
                media = held[MEDIA] if held[MEDIA] is not None else {was: held[COUNT]}
                media[medium] = media.get(medium, 0) + 1
                held[MEDIA] = media if len(media) > 1 else None
            self.ambiguous[key] = None
            self.ambiguous.move_to_end(key)
            if len(self.ambiguous) > self.history:
                self._drop_ambiguous()
        held[COUNT] += 1
        if attrs is not None or held[ATTRS] is None:
            held[ATTRS] = attrs
        held[BLIND] = blind
        self.media[medium] = self.media.get(medium, 0) + 1

    def _drop_ambiguous(self) -> None:
        """Forget the least recently touched key that may be a phantom (re-announced, then removed)."""
        old = self.ambiguous.popitem(last=False)[0]
        held = self.live.pop(old)
        self._ungroup(old)
        if held[MEDIA]:
            for m, n in held[MEDIA].items():
                self.media[m] = self.media.get(m, n) - n
        else:
            m = held[ATTRS][0] if held[ATTRS] is not None else None
            self.media[m] = self.media.get(m, held[COUNT]) - held[COUNT]
        self.retire(old)
        self._forget(old)

    # ------------------------------------------------------------------ block sizes and partial entries

    def _shape(self, group: int, size: int, n: int, pos: Position) -> str | None:
        """A store's kind: ``"full"`` blocks, a ``"partial"`` entry, or None (not known yet).

        A group's full size is declared, or learned: the size of its first store of several hashes,
        else the larger of the first two sizes its one-hash stores show.  A partial entry is one
        hash of a size below the full one, dividing it (vLLM's ``hash_block_size``).
        """
        if size > self.largest.get(group, 0):
            self.largest[group] = size
        if size <= 0 or not n:
            return "full"  # the offload caller's announcement (size 0), or a store of no block
        full = self.full.get(group)
        if full is None:
            if n > 1:
                self._learn(group, size)
                return "full"
            first = self.first_size.setdefault(group, size)
            if first == size:
                return None
            full = max(first, size)
            self._learn(group, full)
        if size == full:
            return "full"
        if n == 1 and size < full and full % size == 0:
            known = self.partial.setdefault(group, size)
            if known != size:
                self._odd(group, size, pos, f"a second partial-entry size {size} (group {group} showed "
                          f"{known} before, full size {full})")
            return "partial"
        self._odd(group, size, pos, f"block_size {size} in a store of {n} hash(es): group {group}'s full "
                  f"size is {full}" + (" (declared)" if group in self.declared else " (learned)"))
        return "full"

    def _odd(self, group: int, size: int, pos: Position, what: str) -> None:
        if (group, size) in self.odd or len(self.odd) >= _ODD_SIZES:
            return
        self.odd.add((group, size))
        self._warn("block-size-change", pos, f"{what}: a group's block size is fixed for an engine's life")

    def _learn(self, group: int, full: int) -> None:
        self.full[group] = full
        for p in self.pending.pop(group, ()):
            self._decide(p, full)

    def _hold(self, group: int, pending: _Pending) -> None:
        held = self.pending.setdefault(group, deque())
        held.append(pending)
        if len(held) > PENDING:
            self._decide(held.popleft(), None)

    def _decide(self, p: _Pending, full: int | None) -> None:
        if full is not None and p.size < full and full % p.size == 0:
            self._partial(p.position, p.size, full, p.key, p.orphan is not None)
            return
        if full is not None and p.size != full:
            self._odd(p.group, p.size, p.position, f"block_size {p.size} in a one-hash store: group "
                      f"{p.group}'s full size is {full}")
        if p.orphan is None:
            return
        if full is not None:
            self._orphan(p.position, p.orphan, p.hidden)
        else:
            self.unverified_parents += 1
            self._warn("parent-unannounced", p.position, p.orphan.replace(
                "BlockStored", "One-hash BlockStored", 1) + ": a partial entry or an orphaned full "
                "block; its group showed one block size, so the checker cannot tell (give --block-sizes)")

    def _orphan(self, pos: Position, message: str, hidden: int) -> None:
        """A full block's parent never stored: a violation, unless blocks were skipped before it."""
        if not hidden:
            self._violation(Violation("parent-unknown", pos, message))
            return
        self.unverified_parents += 1
        self._warn("parent-unannounced", pos, f"{message}; {hidden} block(s) of its group were skipped in "
                   "stores since then (null or masked: in the token_ids, not in the hashes), and a later "
                   "store may name one of those as its parent: the checker cannot tell this from an orphan")

    def _partial(self, pos: Position, size: int, full: int, key: str, unannounced: bool) -> None:
        self._warn("partial-entry", pos, f"BlockStored of {key} with block_size {size}, below its group's "
                   f"full size {full}: a partial entry" + ("; its parent, at the hash_block_size grain, was "
                                                            "never announced" if unannounced else ""))

    # ------------------------------------------------------------------ against the pool, and the end

    def compare(self, line: int, copies: Copies) -> None:
        """The pool's index after ``line`` (a trace's observation) against the stream's copies.

        Every copy the pool holds must have been announced and not removed
        (``event_announcements_match_index``); the stream may account for more (a
        re-announced hit): those are phantoms, counted.
        """
        for key, n in copies.items():
            held = self.live.get(key)
            have = held[COUNT] if held is not None else 0
            if have < n:
                self._violation(Violation("event_announcements_match_index", Position(line),
                                          f"the pool holds {n} cop(ies) of {_key(key)}, the stream accounts "
                                          f"for {have}"))
        self.phantoms = sum(1 for key, held in self.live.items() if held[COUNT] > copies.get(key, 0))
        self.snapshots += 1

    def restart(self, pos: Position, known_empty: bool) -> None:
        """Start over at ``pos``: from an empty index (a new engine, read from its first batch), or
        from an unknown one (batches lost): then nothing stored before ``pos`` is judged."""
        self.finish()
        for key in self.live:
            self.retire(key)
        self._fresh(None if known_empty else pos)

    def finish(self) -> None:
        """The end of what is read: one-hash stores still undecided are reported as such."""
        for group in list(self.pending):
            for p in self.pending.pop(group):
                self._decide(p, None)

    @property
    def left_stored(self) -> int:
        return len(self.live)

    def holds_hash(self, h: Any) -> bool:
        """Whether some group holds a copy of this 64-bit hash."""
        return h in self.groups


__all__ = ["HISTORY", "Facts", "StreamChecker"]

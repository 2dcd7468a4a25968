"""llm-d's KV-cache manager, read from its source: request keys from tokens, a flat index to pods.

llm-d does not index vLLM's block hashes: it hashes each event's ``token_ids``
again, ``block_size`` tokens at a time (its own configured size), chained
from the parent's *request key*, and indexes those request keys to pod
entries; vLLM's hashes (*engine keys*) only map to request keys, for parents
and removals.  A query hashes the request's tokens the same way and counts the
leading request keys the pod has an entry under (``kvblock_scorer.go``).

Its 2025 and 2026 releases differ in six places, each an option of :class:`LlmdOptions`
(``clear``, ``parent``, ``add``, ``groups``, ``lora``, ``extra``); ``2025`` is the release at
b6404af (2025-12-28), ``2026`` the one at 7be76e1 (2026-06-12).  :data:`RULES` cites the
commit of ``llm-d/llm-d-kv-cache`` that changed each; ``docs/routers.md`` tabulates them.

One pod is checked; the LRU bounds (10^8 keys, 10 entries per key) are not
reached by kvpool's traces and are not modelled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace
from itertools import takewhile
from typing import Any

from ..kinds import Position, event_group
from .base import Cause, Profile, Query, Reaction, Recent, Rule, event_hashes, event_parent, show_hash

_REPO = "llm-d/llm-d-kv-cache"
_OLD, _NEW = "b6404af14b54", "7be76e119ca5"
POOL_2025 = f"{_REPO} pkg/kvcache/kvevents/pool.go@{_OLD}"
POOL_2026 = f"{_REPO} pkg/kvevents/pool.go@{_NEW}"
INDEX_2025 = f"{_REPO} pkg/kvcache/kvblock/in_memory.go@{_OLD}"
INDEX_2026 = f"{_REPO} pkg/kvcache/kvblock/in_memory.go@{_NEW}"
TOKENS = f"{_REPO} pkg/kvcache/kvblock/token_processor.go@{_OLD}, @{_NEW}"
SCORER = f"{_REPO} pkg/kvcache/kvblock_scorer.go@{_OLD}, @{_NEW}"

RULES = {r.id: r for r in (
    Rule("llm-d.request-keys", "a store's token_ids are hashed block_size tokens at a time from its "
         "parent's request key (or the model's root), a partial chunk dropped; its block hashes only "
         "map to those keys (TokensToKVBlockKeys)", f"{TOKENS}; {POOL_2025}; {POOL_2026}"),
    Rule("llm-d.parent-restart", "a store whose parent hash maps to no request key is hashed from "
         "the model's root, as if it began a prompt (2025; changed by 6f62751)", POOL_2025),
    Rule("llm-d.parent-drop", "a store whose parent hash maps to no request key is dropped "
         "(GetRequestKey error: continue; since 6f62751, #243)", POOL_2026),
    Rule("llm-d.add-strict", "Index.Add refuses a store whose hash count differs from its request-key "
         "count; a store with no hash is not added (2025; changed by c89a98d)",
         f"{INDEX_2025}; {POOL_2025}"),
    Rule("llm-d.add-ratio", "Index.Add maps hashes to request keys by the ratio of their counts; with "
         "no hash it reads engineKeys[0] of an empty slice, a Go panic (since c89a98d, #511)",
         f"{INDEX_2026}; {POOL_2026}"),
    Rule("llm-d.tier-update", "a store with no token_ids adds the pod to the request keys its hashes "
         "already map to, and is skipped when they map to none (handleDeviceTierUpdate)", POOL_2026),
    Rule("llm-d.pod-entry", "a request key holds a set of pod entries (pod, device tier from medium; "
         "and group_idx since 2ffc3eb, #627): a second store of an entry is the same entry",
         f"{INDEX_2025}; {INDEX_2026}"),
    Rule("llm-d.evict", "a removal takes its entry off every request key the hash maps to; the map "
         "entry goes when they are all empty (Evict)", f"{INDEX_2025}; {INDEX_2026}"),
    Rule("llm-d.clear-ignored", "AllBlocksCleared is ignored (2025: case AllBlocksCleared: continue; "
         "changed by 7be76e1)", POOL_2025),
    Rule("llm-d.clear", "AllBlocksCleared removes every entry of the pod (Index.Clear; since "
         "7be76e1, #626)", f"{POOL_2026}; {INDEX_2026}"),
    Rule("llm-d.lora-model", "the LoRA name, when set, replaces the model name at the root of the "
         "chain (since 6f62751, #243); before, the base model's root for every store", POOL_2026),
    Rule("llm-d.extra-keys", "every string of a block's extra_keys (LoRA name, cache salt, multimodal "
         "identifier) taints its request key; a query's keys carry only its multimodal items "
         "(ParseRawExtraKeys, ComputeBlockExtraFeatures; since 51f2f51, #444 and 96fdbab, #495)",
         f"{POOL_2026}; {_REPO} pkg/kvcache/kvblock/extra_keys.go@{_NEW}"),
    Rule("llm-d.score", "a query counts the leading request keys the pod has any entry under, of any "
         "tier and any group (LongestPrefixScorer)", SCORER),
)}

BASE_MODEL = "model"


@dataclass(frozen=True)
class LlmdOptions:
    """llm-d's release differences, each one switch (``docs/routers.md``'s table)."""

    clear: bool
    parent: str  # "restart" | "drop"
    add: str  # "strict" | "ratio"
    groups: bool
    lora: bool
    extra: bool


RELEASES = {
    "2025": LlmdOptions(clear=False, parent="restart", add="strict", groups=False, lora=False, extra=False),
    "2026": LlmdOptions(clear=True, parent="drop", add="ratio", groups=True, lora=True, extra=True),
}
_CHOICES = {"parent": ("restart", "drop"), "add": ("strict", "ratio")}


def parse_options(text: str) -> LlmdOptions:
    """``2026`` or ``2025``, then ``,name=value`` overrides: ``2026,clear=off,parent=restart``."""
    release, *overrides = text.split(",")
    if release not in RELEASES:
        raise ValueError(f"llm-d release {release!r}: expected one of {', '.join(sorted(RELEASES))}")
    opts = RELEASES[release]
    names = {f.name for f in fields(LlmdOptions)}
    for item in overrides:
        name, _, value = item.partition("=")
        if name not in names:
            raise ValueError(f"llm-d option {name!r}: expected one of {', '.join(sorted(names))}")
        choices = _CHOICES.get(name, ("on", "off"))
        if value not in choices:
            raise ValueError(f"llm-d option {name}: expected {' or '.join(choices)}")
        setting: dict[str, Any] = {name: value if name in _CHOICES else value == "on"}
        opts = replace(opts, **setting)
    return opts


Added = tuple[str, Position, int, "int | None"]
"""Why a request key has the pod: (rule, position, hashes, tokens) of the store that added it (tokens
None: a tier update); a :class:`Cause` made only when a query asks."""
Evicted = tuple[Position, int, int, "list[int]"]
"""The removal that emptied a request key: (position, hash, group, other groups whose entry it took)."""


def _added(why: Added) -> Cause:
    rule, position, hashes, tokens = why
    if tokens is None:
        return Cause(rule, position, "re-added by a store with no token_ids")
    return Cause(rule, position, f"added by the store of {hashes} hash(es) and {tokens} token(s)")


def _evicted(why: Evicted) -> Cause:
    position, h, group, others = why
    if not others:
        return Cause("llm-d.evict", position, f"emptied by the removal of {show_hash(h)}: a pod entry is "
                     "one entry however often it was stored")
    return Cause("llm-d.pod-entry", position, f"the removal of {show_hash(h)} in group {group} took the "
                 f"entry stores of group {others} made too: a pod entry does not say its group")


Feature = tuple[str, ...] | None
Entry = tuple[str, int | None]  # (device tier, group or None)


def _event_features(raw: Any) -> list[Feature] | None:
    """ParseRawExtraKeys: per block, its string keys and the identifiers of its pairs."""
    if raw is None:
        return None
    return [tuple(k if isinstance(k, str) else k[0] for k in keys or ()
                  if isinstance(k, str) or (isinstance(k, list) and k and isinstance(k[0], str))) or None
            for keys in raw]


def _realign(features: list[Feature], count: int) -> list[Feature]:
    """realignExtraFeatures: per-hash features spread over ``count`` request-key blocks."""
    if not features or len(features) == count:
        return features
    if len(features) < count:
        return [features[i * len(features) // count] for i in range(count)]
    merged: list[Feature] = [None] * count
    for i, f in enumerate(features):
        at = i * count // len(features)
        if f is not None:
            merged[at] = (merged[at] or ()) + f
    return merged


class LlmdRouter(Profile):
    """llm-d's reading of one pod's stream, with the release's options."""

    repeats = "one copy"
    rules = RULES

    def __init__(self, block_sizes: dict[int, int], options: LlmdOptions, name: str = "llm-d"):
        super().__init__(block_sizes)
        self.opts = options
        self.name = name
        self.size = block_sizes.get(0, 0)
        self.e2r: dict[int, list[int]] = {}
        self.refs: dict[int, int] = {}
        """Per request key: the hashes whose e2r entry names it."""
        self.unnamed: deque[int] = deque()
        """Request keys no hash names any more, oldest first: past ``cap`` of them, one still
        indexed is dropped (llm-d keeps it until its LRU bound)."""
        self.data: dict[int, Entry | set[Entry]] = {}
        """Per request key: its pod entry, or a set of them when stores of several tiers or groups
        added it (one shared tuple per key, the usual case, instead of a set per block)."""
        self.added: Recent[int, tuple[int, Added, frozenset[int]]] = Recent()
        """Per request key: when (event sequence) and why the pod was last added, by which hashes."""
        self.groups_of: dict[int, set[int]] = {}
        """Per request key: the groups whose stores added the pod since the key was last empty."""
        self.removed: Recent[int, tuple[int, Cause | Evicted]] = Recent()
        self.dropped: Recent[int, tuple[int, Cause]] = Recent()
        self.stored: Recent[int, tuple[int, Position, bool, str]] = Recent()
        """Per hash: its last indexed store (event sequence, position, whether strings in its extra
        keys tainted its request keys)."""
        self.tainted: Recent[int, None] = Recent()
        """Request keys whose chain some extra key's bare string (LoRA name, cache salt) tainted."""
        self.seq = 0
        self.ignored_clear: tuple[int, Position] | None = None
        self._roots: dict[str | None, int] = {}
        self._entries: dict[tuple[Any, Any], tuple[Entry, int]] = {}
        """Per (medium, group_idx) an event says: its pod entry and group, one shared object."""

    # ------------------------------------------------------------------ keys

    def _root(self, lora: str | None) -> int:
        root = self._roots.get(lora)
        if root is None:
            root = self._roots[lora] = hash(("root", lora if self.opts.lora and lora else BASE_MODEL))
        return root

    def _chain(self, parent: int, tokens: list[int] | tuple[int, ...], features: list[Feature] | None
               ) -> list[int]:
        """Request keys: llm-d's are digests of the same parts; within one run any good hash of them
        names the same keys (Python's, of ints and strings, is stable within a process)."""
        keys, at, size = [], parent, self.size
        for i in range(len(tokens) // size if size else 0):
            at = hash((at, tuple(tokens[i * size:(i + 1) * size]), features[i] if features else None))
            keys.append(at)
        return keys

    # ------------------------------------------------------------------ events

    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        self.seq += 1
        kind = event["type"]
        if kind == "AllBlocksCleared":
            if not self.opts.clear:
                self.ignored_clear = (self.seq, pos)
                kept = sum(1 for e in self.data.values() if e)
                return [Reaction("ignored-clear", "llm-d.clear-ignored", pos,
                                 f"{kept} request key(s) stay indexed")] if kept else []
            if self.explains:
                for rk in self.data:
                    self.removed[rk] = (self.seq, Cause("llm-d.clear", pos, "cleared"))
            self.data.clear()
            self.groups_of.clear()  # one pod: every entry is the pod's
            return []
        said = (event.get("medium"), event.get("group_idx"))
        known = self._entries.get(said)
        if known is None:
            known = self._entries[said] = self._entry(*said)
        entry, in_group = known
        if kind == "BlockRemoved":
            for h in event_hashes(event):
                self._evict(h, entry, in_group, pos)
            return []
        hashes = event_hashes(event)
        reactions = self._store(event, hashes, entry, pos)
        # A partial entry (a block_size below its group's) names no full block: what befalls it is
        # kept for explanations, not reported.
        return [] if 0 < event["block_size"] < self.block_sizes.get(in_group, 0) else reactions

    def _entry(self, medium: Any, group: Any) -> tuple[Entry, int]:
        in_group = 0 if group is None else group
        if len(self._entries) >= 1_024:  # bounded, whatever media and groups a stream names
            self._entries.clear()
        return ((medium or "gpu").lower(), in_group if self.opts.groups else None), in_group

    def _drop(self, hashes: list[int], rule: str, pos: Position, kind: str, message: str) -> list[Reaction]:
        if self.explains:
            for h in hashes:
                self.dropped[h] = (self.seq, Cause(rule, pos, message))
        return [Reaction(kind, rule, pos, message)]

    def _store(self, event: dict[str, Any], hashes: list[int], entry: Entry, pos: Position) -> list[Reaction]:
        reactions: list[Reaction] = []
        root = self._root(event.get("lora_name"))
        parent_hash, start = event_parent(event), root
        if parent_hash is not None and parent_hash != 0:  # 0: no parent, to llm-d
            mapped = self.e2r.get(parent_hash)
            if mapped:
                start = mapped[-1]
            elif self.opts.parent == "drop":
                return self._drop(hashes, "llm-d.parent-drop", pos, "dropped-store",
                                  f"parent {show_hash(parent_hash)} maps to no request key: store dropped")
            else:
                reactions.append(Reaction("restarted-chain", "llm-d.parent-restart", pos,
                                          f"parent {show_hash(parent_hash)} maps to no request key: "
                                          "hashed from the model's root"))
        tokens = event["token_ids"]
        raw = event.get("extra_keys") if self.opts.extra else None
        features = _event_features(raw) if raw is not None and (not raw or any(raw)) else None
        chunks = len(tokens) // self.size if self.size else 0
        if features is not None:
            features = None if not chunks else _realign(features, chunks)
            if features is not None and len(features) != chunks:
                return reactions + self._drop(
                    hashes, "llm-d.extra-keys", pos, "dropped-store",
                    f"{len(features)} extra_keys entr(ies) for {chunks} block(s) of tokens: store dropped")
        keys = self._chain(start, tokens, features)
        rule = ("llm-d.parent-restart" if reactions else "llm-d.request-keys")
        why: Added = (rule, pos, len(hashes), len(tokens))
        if not keys:
            return reactions + self._no_keys(hashes, tokens, entry, pos)
        if self.opts.add == "strict":
            if not hashes:
                return reactions
            if len(hashes) != len(keys):
                return reactions + self._drop(hashes, "llm-d.add-strict", pos, "dropped-store",
                                              f"{len(hashes)} hash(es) for {len(keys)} request key(s): "
                                              "Index.Add refuses the store")
            for h, rk in zip(hashes, keys, strict=True):
                self._map(h, [rk])
        else:
            if not hashes:
                return [*reactions, Reaction("unhandled", "llm-d.add-ratio", pos,
                                             f"no hash for {len(keys)} request key(s): Index.Add reads "
                                             "engineKeys[0] of an empty slice (a Go panic)")]
            if len(hashes) == len(keys) and (len(hashes) == 1 or len(set(hashes)) == len(hashes)):
                e2r, refs = self.e2r, self.refs
                for h, rk in zip(hashes, keys, strict=True):  # one to one: the ratio is 1
                    if h in e2r:
                        self._map(h, [rk])
                    else:  # _map's common case: a hash mapped for the first time
                        e2r[h] = [rk]
                        refs[rk] = refs.get(rk, 0) + 1
            else:
                n = max(len(hashes), len(keys))
                mapping: dict[int, list[int]] = {}
                for i in range(n):
                    mapping.setdefault(hashes[i * len(hashes) // n], []).append(keys[i * len(keys) // n])
                for h, rks in mapping.items():
                    self._map(h, rks)
        if hashes and len(tokens) != event["block_size"] * len(hashes):
            reactions.append(Reaction("misread-store", "llm-d.request-keys", pos,
                                      f"{len(hashes)} hash(es) with {len(tokens)} token_ids: indexed as "
                                      f"{len(keys)} request key(s) of those tokens"))
        data = self.data
        if not self.explains:  # no query will ask why: the index alone
            for rk in keys:
                if data.setdefault(rk, entry) != entry:
                    self._also(rk, entry)
            return reactions
        group, named = event_group(event), frozenset(hashes)
        for rk in keys:
            self._add(rk, entry, why, named, group)
        tainted = start in self.tainted or bool(raw and any(raw) and any(
            isinstance(k, str) for keys in raw for k in keys or ()))
        if tainted:
            for rk in keys:
                self.tainted[rk] = None
        indexed, stored = (self.seq, pos, tainted, rule), self.stored
        for h in hashes:
            stored[h] = indexed
        return reactions

    def _no_keys(self, hashes: list[int], tokens: list[int], entry: Entry, pos: Position) -> list[Reaction]:
        """A store whose tokens make no request key: a tier update (2026) or a refused Add (2025)."""
        if self.opts.add == "strict":
            if hashes:
                return self._drop(hashes, "llm-d.add-strict", pos, "dropped-store",
                                  "no request key from its token_ids: Index.Add refuses the store")
            return []
        if tokens or not hashes:
            return []  # a partial block: skipped
        resolved = list(dict.fromkeys(self.e2r[h][-1] for h in hashes if self.e2r.get(h)))
        if not resolved:
            return self._drop(hashes, "llm-d.tier-update", pos, "dropped-store",
                              "no token_ids and no request key known for its hashes: skipped")
        why: Added = ("llm-d.tier-update", pos, len(hashes), None)
        named = frozenset(hashes)
        for rk in resolved:
            self._add(rk, entry, why, named, entry[1] if entry[1] is not None else -1)
        return []

    def _also(self, rk: int, entry: Entry) -> None:
        """Add an entry to a request key that holds another (a set from then on)."""
        entries = self.data[rk]
        if type(entries) is set:
            entries.add(entry)
        else:
            self.data[rk] = {entries, entry}  # type: ignore[arg-type]

    def _add(self, rk: int, entry: Entry, why: Added, hashes: frozenset[int], group: int) -> None:
        if self.data.setdefault(rk, entry) != entry:
            self._also(rk, entry)
        if not self.explains:
            return
        self.added[rk] = (self.seq, why, hashes)
        groups = self.groups_of.get(rk)
        if groups is None:
            self.groups_of[rk] = {group}
        else:
            groups.add(group)
        self.removed.pop(rk, None)

    def _evict(self, h: int, entry: Entry, group: int, pos: Position) -> None:
        rks = self.e2r.get(h)
        if not rks:
            return
        data = self.data
        for rk in rks:
            entries = data.get(rk)
            if entries is None:
                continue
            if type(entries) is set:
                entries.discard(entry)
                if entries:
                    continue
            elif entries != entry:
                continue
            del data[rk]
            if not self.explains:
                continue
            groups = self.groups_of.pop(rk, None)
            alone = groups is None or (len(groups) == 1 and group in groups)
            others = [] if groups is None or alone else sorted(g for g in groups if g != group)
            self.removed[rk] = (self.seq, (pos, h, group, others))
        if len(rks) == 1:
            rk = rks[0]
            if rk in data:
                return
            # _map(h, None)'s common case: the hash's one request key left the index
            refs = self.refs
            left = refs[rk] - 1
            if left:
                refs[rk] = left
            else:
                del refs[rk]
            del self.e2r[h]
        elif all(rk not in data for rk in rks):
            self._map(h, None)

    def _map(self, h: int, rks: list[int] | None) -> None:
        """Set (or, with None, delete) a hash's request keys, counting the hashes naming each key."""
        old = self.e2r.pop(h, None) if rks is None else self.e2r.get(h)
        refs = self.refs
        if rks is not None:
            self.e2r[h] = rks
            for rk in rks:
                refs[rk] = refs.get(rk, 0) + 1
        if old is None:
            return
        for rk in old:
            left = self.refs[rk] - 1
            if left:
                self.refs[rk] = left
                continue
            del self.refs[rk]
            if rk in self.data:
                self.unnamed.append(rk)
        while len(self.unnamed) > self.cap:
            rk = self.unnamed.popleft()
            if rk not in self.refs:
                self._drop_key(rk)

    def _drop_key(self, rk: int) -> None:
        self.data.pop(rk, None)
        self.groups_of.pop(rk, None)

    def forget(self, key: tuple[int, int]) -> None:
        h = key[0]
        self.dropped.pop(h, None)
        self.stored.pop(h, None)
        rks = self.e2r.get(h)
        if rks is None:
            return
        self._map(h, None)
        for rk in rks:
            if rk not in self.refs:
                self._drop_key(rk)

    # ------------------------------------------------------------------ queries

    def _query_keys(self, query: Query) -> list[int]:
        features: list[Feature] | None = None
        if self.opts.extra:
            features = [query.mm_in(i * self.size, (i + 1) * self.size) or None
                        for i in range(len(query.tokens) // self.size if self.size else 0)]
        return self._chain(self._root(query.lora_name), query.tokens, features)

    def prefix(self, query: Query) -> int:
        n = sum(1 for _ in takewhile(self.data.get, self._query_keys(query)))
        return min(len(query.hashes), n * self.size // query.block_size)

    def explain(self, query: Query, block: int, held: bool) -> Cause:
        self._explaining()
        keys = self._query_keys(query)
        at = block * query.block_size // self.size if self.size else 0
        rk = keys[at] if at < len(keys) else None
        h = query.hashes[block]
        if held and rk is not None and rk in self.added:
            seq, why, hashes = self.added[rk]
            if self.ignored_clear is not None and seq < self.ignored_clear[0]:
                return Cause("llm-d.clear-ignored", self.ignored_clear[1], "indexed before a clear "
                             "the router ignored")
            held_by = self.data.get(rk)
            entries = held_by if isinstance(held_by, set) else () if held_by is None else {held_by}
            if self.opts.groups and entries and all(g is not None and g != query.group for _, g in entries):
                return Cause("llm-d.score", why[1], "held only under another group's entry")
            groups = self.groups_of.get(rk, set())
            if not self.opts.groups and query.group not in groups:
                return Cause("llm-d.pod-entry", why[1], f"held by stores of group {sorted(groups)}: "
                             "a pod entry does not say its group")
            if h not in hashes:
                return Cause(why[0], why[1], "the request key was made by the store of "
                             f"{', '.join(show_hash(x) for x in sorted(hashes)[:3])}: the same tokens from "
                             "the same chain, under another pool key (LoRA, cache salt or multimodal items "
                             "it does not see, or token_ids not filling their blocks)")
            return _added(why)
        if held:
            return Cause("llm-d.score", None, "reached by the query")
        found: list[tuple[int, Cause]] = []
        if h in self.dropped:
            found.append(self.dropped[h])
        if rk is not None and rk in self.removed:
            when, gone = self.removed[rk]
            found.append((when, gone if isinstance(gone, Cause) else _evicted(gone)))
        stored = self.stored.get(h)
        if stored is None or any(seq > stored[0] for seq, _ in found):
            return max(found, key=lambda f: f[0])[1] if found else Cause(
                "llm-d.request-keys", None, "never indexed under the query's request key")
        _, pos, tainted, rule = stored
        if rule == "llm-d.parent-restart":
            return Cause(rule, pos, "the store of this block was hashed from the model's root, as the "
                         "start of a prompt, since its parent mapped to no request key")
        if tainted:
            return Cause("llm-d.extra-keys", pos, "the store of this block was indexed under request keys "
                         "that strings in its chain's extra_keys (LoRA name, cache salt) tainted; the "
                         "query's keys carry none of them")
        return Cause("llm-d.request-keys", pos, "the store of this block was indexed under request keys "
                     "made from other tokens or another chain than the query's")

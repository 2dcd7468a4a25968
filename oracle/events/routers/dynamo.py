"""NVIDIA Dynamo's KV router, read from its source: a publisher filter, a dedup count, a radix tree.

The path of one vLLM event through Dynamo (one worker, one DP rank): ``zmq_wire.rs``
decodes it into blocks (filters, tree keys from token slices), ``event_processor.rs``
filters the tier and counts stores per hash (a removal passes at zero), ``radix_tree.rs``
applies it to the tree, and a query walks that tree by tree keys.  :data:`RULES` gives
each step, in that order, with its source.

Not modelled: several workers and DP ranks (one engine is checked), the
approximate indexer (``approx.rs``, used when events are off), batching
windows (they merge chained stores; the order of effects is the same), and
the lower tiers.  Multimodal identifiers are taken as given: Dynamo parses
only vLLM's 64-hex digests (``parse_mm_hash_from_extra_key``); kvpool's
workload names its items with short names, read here as digests.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..kinds import Position
from .base import Cause, Profile, Query, Reaction, Recent, Rule, event_hashes, event_parent, show_hash

_REPO = "ai-dynamo/dynamo"
ZMQ_WIRE = f"{_REPO} lib/kv-router/src/zmq_wire.rs@0cda21dc69fd"
EVENT_PROCESSOR = f"{_REPO} lib/llm/src/kv_router/publisher/event_processor.rs@0d29bd4e67ad"
PROTOCOLS = f"{_REPO} lib/kv-router/src/protocols.rs@038eab23a6b6"
RADIX_TREE = f"{_REPO} lib/kv-router/src/radix_tree.rs@4276866e1eeb"

RULES = {r.id: r for r in (
    Rule("dynamo.group-filter", "an event with a group_idx other than 0 (and no main-attention "
         "kv_cache_spec_kind) is ignored (KvCacheEventFilter::should_ignore)", ZMQ_WIRE),
    Rule("dynamo.medium-filter", "an event whose medium names a tier other than the GPU (CPU, "
         "CPU_PINNED, DISK, ...) is not indexed (StorageTier::from_kv_medium; is_local_gpu)",
         f"{PROTOCOLS}; {EVENT_PROCESSOR}"),
    Rule("dynamo.duplicate-hash", "a BlockStored whose hashes repeat, or repeat its parent, is "
         "dropped (convert_event)", ZMQ_WIRE),
    Rule("dynamo.block-size", "a BlockStored publishes one block per hash, its tokens sliced "
         "block_size at a time from the start of token_ids, and none when block_size is not the "
         "router's kv_block_size (create_stored_blocks)", ZMQ_WIRE),
    Rule("dynamo.tokens-hash", "a block's tree key is the hash of its token slice, the LoRA name and "
         "its multimodal identifiers; not its block hash, its parent, nor the cache salt "
         "(create_stored_block_from_parts, extra_keys_to_block_mm_infos)", ZMQ_WIRE),
    Rule("dynamo.dedup-store", "each published block hash is counted once more per store "
         "(EventDedupFilter::track_store)", EVENT_PROCESSOR),
    Rule("dynamo.dedup-remove", "a removal reaches the index only when its hash's count falls to 0; "
         "an uncounted hash passes (EventDedupFilter::filter_remove)", EVENT_PROCESSOR),
    Rule("dynamo.parent-not-found", "a BlockStored whose parent hash is not in the worker's lookup "
         "table is dropped whole (ParentBlockNotFound)", RADIX_TREE),
    Rule("dynamo.reuse-node", "a block joins the parent's child with its tree key, whatever hash that "
         "node was made for; otherwise the worker's node for its hash is reused under the parent "
         "(apply_event)", RADIX_TREE),
    Rule("dynamo.self-reference", "a block whose node is the parent node itself is rejected after "
         "the edge was inserted; the rest of the store is dropped (InvalidBlockSequence)", RADIX_TREE),
    Rule("dynamo.remove", "a removal takes the worker off the hash's node; a node no worker holds "
         "loses all its children (apply_event, Removed)", RADIX_TREE),
    Rule("dynamo.clear", "AllBlocksCleared takes the worker off every node and forgets its lookup "
         "table and counts (clear_all_blocks; EventDedupFilter::clear)",
         f"{RADIX_TREE}; {EVENT_PROCESSOR}"),
    Rule("dynamo.find-matches", "a query walks from the root by the tree keys of the request's "
         "blocks; the score is the depth the worker is present to (find_matches)", RADIX_TREE),
)}

_OTHER_TIERS = frozenset({"CPU", "CPU_PINNED", "CPU_TIER1", "CPU_TIER2", "DISK", "NVME", "STORAGE",
                          "EXTERNAL", "NETWORK", "REMOTE", "SHARED"})
"""Media that StorageTier::from_kv_medium maps to a tier other than the device (unknown: the device)."""

TreeKey = tuple[tuple[int, ...], str | None, tuple[str, ...]]
"""A block's tree key (Dynamo's LocalBlockHash): its tokens, the LoRA name, multimodal identifiers."""


Why = tuple[str, Position, "int | None", "bool | None"]
"""Why the worker is on a node (a store put it there: rule, position, hash, whether its tokens filled
its blocks) or was taken off it (the last is None): a :class:`Cause` made only when a query asks."""


def _cause(why: Why) -> Cause:
    rule, position, h, aligned = why
    if aligned is None:
        text = "cleared" if h is None else f"taken off by the removal of {show_hash(h)}"
    else:
        text = f"put there by the store of {show_hash(h or 0)}" + (
            "" if aligned else " (its token_ids do not fill its blocks)")
    return Cause(rule, position, text)


class _Node:
    __slots__ = ("block_hash", "cause", "children", "emptied", "gone_hash", "held", "key", "parent")

    def __init__(self, block_hash: int | None):
        self.block_hash = block_hash
        self.parent: _Node | None = None
        self.key: TreeKey | None = None
        """Where the node hangs: its parent's child under this tree key (the last edge made to it)."""
        self.children: dict[TreeKey, _Node] = {}
        self.held = False
        self.cause: Why | None = None
        """Why the worker is on this node (the store that put it there)."""
        self.emptied: Position | None = None
        """The removal that last cleared this node's children."""
        self.gone_hash: int | None = None
        """The hash whose removal last took the worker off this node."""


def _mm_ids(keys: Any) -> tuple[str, ...]:
    """The multimodal identifiers among one block's extra keys (pairs; bare strings are LoRA or salt)."""
    if not isinstance(keys, list):
        return ()
    return tuple(k[0] for k in keys if isinstance(k, list) and k and isinstance(k[0], str))


class DynamoRouter(Profile):
    """Dynamo's reading of one worker's stream; answers for group 0 only."""

    name = "dynamo"
    repeats = "another copy"
    rules = RULES

    def __init__(self, block_sizes: dict[int, int]):
        super().__init__(block_sizes)
        self.kv_block_size = block_sizes.get(0)
        self.root = _Node(None)
        self.lookup: dict[int, _Node] = {}
        self.counts: dict[int, int] = {}
        """The dedup filter's count per hash."""
        self.latest: Recent[int, Position] = Recent()
        """Per hash: its latest store counted (what stays counted when removals take the oldest)."""
        self.filtered: Recent[int, Position] = Recent()
        """Hashes whose last removal the dedup filter kept from the tree."""
        self.dropped: Recent[int, Cause] = Recent()
        """Hashes whose last store the router did not index, and why."""
        self.dead: deque[_Node] = deque()
        """Nodes the worker left, oldest first: past ``cap`` of them, a childless one is unhung."""

    def answers(self, group: int) -> bool:
        return group == 0

    # ------------------------------------------------------------------ events

    def feed(self, event: dict[str, Any], pos: Position) -> list[Reaction]:
        kind = event["type"]
        if kind == "AllBlocksCleared":
            for node in self.lookup.values():
                self._leave(node, pos, None)
            self.lookup.clear()
            self.counts.clear()
            return []
        group = event.get("group_idx")
        ignored = ("dynamo.group-filter" if group is not None and group != 0
                   else "dynamo.medium-filter" if event.get("medium") in _OTHER_TIERS else None)
        if ignored is not None:
            if kind == "BlockStored" and self.explains:
                for h in event_hashes(event):
                    self.dropped[h] = Cause(ignored, pos, "the store was not indexed")
            return []
        if kind == "BlockRemoved":
            self._remove(event_hashes(event), pos)
            return []
        return self._store(event, event_hashes(event), pos)

    def _store(self, event: dict[str, Any], hashes: list[int], pos: Position) -> list[Reaction]:
        parent = event_parent(event)
        explains = self.explains
        if (len(hashes) > 1 and len(set(hashes)) < len(hashes)) or (parent is not None and parent in hashes):
            for h in hashes if explains else ():
                self.dropped[h] = Cause("dynamo.duplicate-hash", pos, "the store repeats a hash")
            return [Reaction("unhandled", "dynamo.duplicate-hash", pos,
                             "a self-referencing store (a hash repeated): dropped")]
        blocks = self._published(event, hashes)
        counts, latest = self.counts, self.latest
        for h, _ in blocks:  # the count is kept even when the tree refuses the store
            counts[h] = counts.get(h, 0) + 1
            if explains:
                latest[h] = pos
        for h in hashes[len(blocks):] if explains else ():
            self.dropped[h] = Cause("dynamo.block-size", pos, "no block published for this hash")
        if parent is None:
            current = self.root
        elif parent in self.lookup:
            current = self.lookup[parent]
        else:
            for h in hashes if explains else ():
                self.dropped[h] = Cause("dynamo.parent-not-found", pos, f"parent {show_hash(parent)} "
                                        "not in the worker's lookup table")
            return [Reaction("dropped-store", "dynamo.parent-not-found", pos,
                             f"parent {show_hash(parent)} is not in the worker's lookup table: "
                             f"{len(blocks)} block(s) not indexed")] if blocks else []
        aligned = len(event["token_ids"]) == event["block_size"] * len(hashes)
        reactions = [] if aligned or not blocks else [Reaction(
            "misread-store", "dynamo.block-size", pos,
            f"{len(hashes)} hash(es) with {len(event['token_ids'])} token_ids: each block takes the next "
            f"{event['block_size']} tokens from the start, not its own")]
        lookup = self.lookup
        for h, key in blocks:
            child, reused = current.children.get(key), False
            if child is None:
                child = lookup.get(h)
                reused = child is not None
                if child is None:
                    child = _Node(h)
                current.children[key] = child
                child.parent, child.key = current, key
            if child is current:
                for rest in hashes[hashes.index(h):] if explains else ():
                    self.dropped[rest] = Cause("dynamo.self-reference", pos, "rejected as self-referencing")
                return [*reactions, Reaction(
                    "unhandled", "dynamo.self-reference", pos, f"block {show_hash(h)} is its own parent's "
                    "node: the tree now refers to itself and the rest of the store is dropped")]
            child.held = True
            lookup[h] = child
            current = child
            if explains:
                rule = ("dynamo.block-size" if not aligned else "dynamo.reuse-node" if reused
                        else "dynamo.tokens-hash")
                child.cause = (rule, pos, h, aligned)
                self.dropped.pop(h, None)
        return reactions

    def _published(self, event: dict[str, Any], hashes: list[int]) -> list[tuple[int, TreeKey]]:
        """The blocks create_stored_blocks makes of a store: (hash, tree key) per published block."""
        size, tokens = event["block_size"], event["token_ids"]
        if size != self.kv_block_size:
            return []
        extra = event.get("extra_keys") or ()
        lora = event.get("lora_name")
        return [(hashes[i], (tuple(tokens[i * size:(i + 1) * size]), lora,
                             _mm_ids(extra[i]) if i < len(extra) and extra[i] else ()))
                for i in range(min(len(hashes), len(tokens) // size))]

    def _remove(self, hashes: list[int], pos: Position) -> None:
        counts, lookup, explains, dead = self.counts, self.lookup, self.explains, self.dead
        for h in hashes:
            n = counts.get(h)
            if n is not None:
                if n > 1:
                    counts[h] = n - 1
                    if explains:
                        self.filtered[h] = pos
                    continue
                del counts[h]
            if explains:
                self.filtered.pop(h, None)
            node = lookup.pop(h, None)
            if node is None:  # BlockNotFound: skipped
                continue
            if explains or len(dead) >= self.cap:
                self._leave(node, pos, h)
                continue
            node.held = False  # _leave's common case: nothing to explain, the dead below their bound
            if node.children:
                node.children.clear()
            dead.append(node)

    def _leave(self, node: _Node, pos: Position, h: int | None = None) -> None:
        node.held = False
        if self.explains:
            node.gone_hash = h
            node.cause = ("dynamo.clear" if h is None else "dynamo.remove", pos, h, None)
            if node.children:
                node.emptied = pos
        node.children.clear()
        self.dead.append(node)
        while len(self.dead) > self.cap:
            old = self.dead.popleft()
            if not old.held and not old.children:
                self._unhang(old)

    @staticmethod
    def _unhang(node: _Node) -> None:
        """Take a node off its parent's children (the worker is on neither it nor, then, its subtree)."""
        parent, key = node.parent, node.key
        if parent is not None and key is not None and parent.children.get(key) is node:
            del parent.children[key]
        node.parent = node.key = None

    def forget(self, key: tuple[int, int]) -> None:
        h, group = key
        self.dropped.pop(h, None)
        if group != 0:
            return
        self.counts.pop(h, None)
        self.latest.pop(h, None)
        self.filtered.pop(h, None)
        node = self.lookup.pop(h, None)
        if node is not None:
            node.held = False
            node.children.clear()
            self._unhang(node)

    # ------------------------------------------------------------------ queries

    def _keys(self, query: Query) -> list[TreeKey]:
        size = self.kv_block_size or query.block_size
        return [(chunk, query.lora_name, query.mm_in(i * size, (i + 1) * size))
                for i, chunk in enumerate(query.chunks(size))]

    def _walk(self, query: Query) -> list[_Node]:
        path, node = [], self.root
        for key in self._keys(query):
            child = node.children.get(key)
            if child is None or not child.held:
                break
            path.append(child)
            node = child
        return path

    def prefix(self, query: Query) -> int:
        size = self.kv_block_size or query.block_size
        return min(len(query.hashes), len(self._walk(query)) * size // query.block_size)

    def explain(self, query: Query, block: int, held: bool) -> Cause:
        self._explaining()
        path = self._walk(query)
        size = self.kv_block_size or query.block_size
        at = block * query.block_size // size
        h = query.hashes[block]
        if held:
            node = path[at] if at < len(path) else None
            if node is None or node.cause is None:
                return Cause("dynamo.find-matches", None, "reached by the walk")
            if self.lookup.get(h) is node and h in self.filtered:
                return Cause("dynamo.dedup-remove", self.filtered[h], "its removal was kept from the tree: "
                             f"{self.counts.get(h, 0)} more store(s) of the hash counted, the latest at "
                             f"{self.latest.get(h)}; a re-announced hit is one")
            if node.block_hash != h:
                return Cause(node.cause[0], node.cause[1],
                             f"the tree node for this block's tokens was made for "
                             f"{show_hash(node.block_hash or 0)}, not {show_hash(h)}")
            return _cause(node.cause)
        if h in self.dropped:
            return self.dropped[h]
        parent = path[-1] if path else self.root
        keys = self._keys(query)
        child = parent.children.get(keys[at]) if at < len(keys) else None
        if child is not None and child.cause is not None:  # on the path, and taken off
            took, at_pos = child.cause[0], child.cause[1]
            if child.gone_hash is not None and child.gone_hash != h:
                return Cause("dynamo.tokens-hash", at_pos, "the tree node this block's tokens lead "
                             f"to also stood for {show_hash(child.gone_hash)}, whose removal took the "
                             "worker off it")
            return Cause(took, at_pos, "the worker was taken off this block's node")
        if parent.emptied is not None:
            return Cause("dynamo.remove", parent.emptied, "the removal of the block before it cleared "
                         "that node's children")
        node = self.lookup.get(h)
        if node is not None:
            rule, put = (node.cause[0], node.cause[1]) if node.cause else ("dynamo.reuse-node", None)
            return Cause(rule, put, "the hash's node is elsewhere in the tree than this "
                         "block's tokens lead" + (": its store's token_ids did not fill its blocks"
                                                  if rule == "dynamo.block-size" else ""))
        return Cause("dynamo.find-matches", None, "no node with this block's tokens under the one before")

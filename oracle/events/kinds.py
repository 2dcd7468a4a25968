"""What a finding on a KV-event stream is: its position, its name, and every name there is.

Every reader of a stream (the file checker, the live watcher, the router
profiles) speaks this vocabulary, so that one event gets one name and one
position whichever way it was read.  A *violation* breaks a rule of vLLM's
stream; a *warning* breaks none but leaves a router guessing; a *transport*
finding says what the watcher could not see (a gap, a restart).
"""

from __future__ import annotations

from typing import Any, NamedTuple

Key = tuple[Any, Any]
"""A prefix-cache key as events name it: (hash in its 64-bit integer form, group)."""

LOW_64 = (1 << 64) - 1


class Position(NamedTuple):
    """Where an event sits: its line (a file's line, or a capture's record), its index among that
    line's events, and the publisher's sequence number of its batch (a wire capture or a live engine).
    A tuple: one is made per event read."""

    line: int
    index: int | None = None  # type: ignore[assignment]  # the event's index: tuple.index is not used
    seq: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}" if self.seq is None else f"record {self.line} seq {self.seq}"
        return where + ("" if self.index is None else f" event {self.index}")

    def order(self) -> tuple[int, int]:
        return self.line, self.index or 0


class Violation(NamedTuple):
    """One named finding at its position (a violation or a warning, by the list it is in)."""

    rule: str
    position: Position
    message: str


VIOLATIONS: dict[str, str] = {
    "event_removals_name_live_keys": "a BlockRemoved of a key with no stored copy left since the last "
                                     "AllBlocksCleared",
    "parent-unknown": "a full-block BlockStored whose parent was never stored in its group since the last "
                      "AllBlocksCleared",
    "event_announcements_match_index": "(a trace) the pool holds a copy the stream never announced, or "
                                       "announced removed",
    "hash-repeated": "a BlockStored that names one hash twice, or names its own parent: a chain that "
                     "contains itself",
}
"""Every rule a stream can break, by name: what breaks it."""

WARNINGS: dict[str, str] = {
    "stored-again": "a store of a key the stream holds: a re-announced hit or a second copy",
    "reannounced-hit": "a store of a key the pool holds, with no new copy (emit_cached_block_events)",
    "second-copy": "a store of a key the pool holds, as one more copy",
    "parent-removed": "a store whose parent was stored and has been removed since",
    "parent-unannounced": "a one-hash store whose parent was never announced, which the checker cannot "
                          "tell from a partial entry (its group showed one block size: give --block-sizes)",
    "partial-entry": "a one-hash store below its group's full block size: a partial block, whose parent "
                     "is at the hash_block_size grain (announced only if a partial entry ended there)",
    "empty-store": "a store with no hash",
    "tokens-not-filling": "a store whose token_ids are not block_size per hash",
    "hash-in-two-groups": "one 64-bit hash held in two KV-cache groups",
    "medium-change": "a store whose parent was stored with another medium",
    "lora-change": "a store whose parent was stored with another LoRA adapter",
    "medium-copy": "a store of a key held in another medium: one key in two tiers",
    "medium-mismatch": "a removal whose medium is not the medium of any copy the stream holds",
    "clear-names-no-medium": "an AllBlocksCleared while keys are held in two or more media: it says "
                             "no medium, and a router drops them all",
    "group-missing": "an event without group_idx in a stream whose other events carry one: read as "
                     "group 0 (by the checker and every router profile)",
    "block-size-change": "a block size that is neither its group's full size nor a partial entry's, or "
                         "a group's full size changing mid-stream",
    "extra-keys-not-per-hash": "a store whose extra_keys are not one entry per hash",
    "lookahead-not-per-hash": "a store whose lookahead_token_ids (vLLM 0.33) are not one list per hash",
}
"""Every warning, by name: what it marks."""

TRANSPORT: dict[str, str] = {
    "joined": "the watcher joined an engine's stream after its first batch (its sequence number was "
              "not 0) and the replay socket did not give the batches before",
    "gap": "batches missing between two sequence numbers; asked of the replay socket; those it no "
           "longer had are lost",
    "restart": "an engine's sequence went back (to 0: a new engine, a fresh pool)",
    "undecodable": "a batch that is not a KVEventBatch: its events are lost",
    "unknown-field": "a field (or event type) no vLLM release kvpool knows has: tolerated, reported once",
    "dp-rank-mismatch": "a batch whose data_parallel_rank is not the rank its endpoint's port says",
    "late": "a batch that arrived after its gap was declared lost: dropped",
}
"""What the watcher (and a capture's replay) reports about the wire rather than the stream."""


def event_group(event: dict[str, Any]) -> int:
    """An event's KV-cache group; an event without one (older vLLM) is read as group 0, by every reader."""
    group = event.get("group_idx")
    return 0 if group is None else int(group)


def hash64(h: Any) -> Any:
    """An event hash in the form every reader compares: the integer, or hex bytes' low 64 bits."""
    if type(h) is int:
        return h & LOW_64 if h < 0 else h
    if isinstance(h, str):
        try:
            return int.from_bytes(bytes.fromhex(h), "big") & LOW_64
        except ValueError:
            return h
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h


def key_text(key: Key) -> str:
    h, group = key
    text = f"{h:#018x}" if isinstance(h, int) else str(h)
    return f"{text}/group {group}"

"""What the model says of the part of a pool a process shows: checks made when a call is sent.

A pool that answers ahead of its process (:mod:`.session`) is checked when
each answer comes; what the model said of the pool then is taken when the
call is sent, as a check of the answer's observation (every call's
footprint, or the whole pool), or of what a process that shows its pool
only when asked showed of the blocks and keys an observe line named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.model.footprints import Footprint
from kvpool.model.pool import keys_of
from kvpool.model.state import Key, PoolState

from ..core.abstraction import concrete_key
from ..trace.check import observation_diffs
from ..trace.schema import Json, show

View = Callable[[dict[str, Json]], list[str]]
"""A check of what a process showed: the differences from the model, as lines."""
_Block = tuple[int, Json, list[str], bool]
"""A block as the model has it: its count, primary key ([hex, tokens]), secondary keys, watched."""


def footprint(model: PoolState, fp: Footprint) -> tuple[list[int], list[Key]]:
    """The blocks and keys the lockstep asks about after a call (its footprint, the keys of its
    blocks after it), in its order."""
    return sorted(fp.blocks), sorted(set(fp.keys).union(*(keys_of(model, b) for b in fp.blocks)))


def _block(model: PoolState, b: int) -> _Block:
    p = model.primary[b]
    return (model.ref[b], None if p is None else [concrete_key(p.key).hex(), p.num_tokens],
            sorted(concrete_key(k).hex() for k in model.secondary[b]), b in model.watchers)


def _block_diffs(where: str, got: tuple[Json, Json, Json, Json], want: _Block) -> list[str]:
    """One block's differences; a primary key shown without its tokens compares its hash only.
    Strictly: a value of another kind (``true`` for a count of 1) differs, so that an answer with
    no difference needs no other reading."""
    ref, primary, second, watch = want
    g_ref, g_primary, g_second, g_watch = got
    if type(g_primary) is list and primary is not None and len(g_primary) == 2 and g_primary[1] is None:
        primary = [primary[0], None]
    diffs = [] if type(g_ref) is int and g_ref == ref else [f"{where} ref: recorded {g_ref}, model {ref}"]
    if g_primary != primary or (g_primary is not None and type(g_primary[1]) is bool):
        diffs.append(f"{where} primary: recorded {show(g_primary)}, model {show(primary)}")
    if g_second is not None and (type(g_second) is not list or sorted(g_second) != second):
        diffs.append(f"{where} secondary: recorded {show(g_second)}, model {show(second)}")
    if g_watch is not None and (type(g_watch) is not bool or g_watch != watch):
        diffs.append(f"{where} watched: recorded {g_watch}, model {watch}")
    return diffs


def _ids(value: Json) -> bool:
    return type(value) is list and all(type(b) is int for b in value)


def footprint_view(model: PoolState, blocks: Sequence[int], keys: Sequence[Key]) -> View:
    """Checks of the blocks and keys a call touched, in the observation a process shows: counts,
    keys (primary with its tokens, secondary), watched, the index entries of each key, the free
    count; what the model says of them now, compared when the answer comes."""
    want_free = len(model.free)
    want = {b: _block(model, b) for b in blocks}
    entries = {concrete_key(k).hex(): list(model.index.get(k, ())) for k in keys}

    def check(recorded: dict[str, Json]) -> list[str]:
        diffs = [] if recorded["num_free"] == want_free else [
            f"observation.num_free: recorded {recorded['num_free']}, model {want_free}"]
        secondary, watched = recorded.get("secondary"), recorded.get("watched")
        for b, block in want.items():
            got = (recorded["ref"][b], recorded["primary"][b],
                   None if secondary is None else secondary[b],
                   None if watched is None else b in watched)
            diffs += _block_diffs(f"observation (block {b})", got, block)
        index = recorded.get("index")
        if index is not None:
            shown = {k: ids for k, ids in index}
            diffs += [f"observation.index {k[-14:]}: recorded {shown.get(k, [])}, model {ids}"
                      for k, ids in entries.items() if shown.get(k, []) != ids]
        return diffs

    return check


def shown_view(model: PoolState, blocks: Sequence[int], keys: Sequence[Key]) -> View:
    """Checks of what a process that shows its pool when asked showed of the blocks and keys an
    observe line named (``shown``: per block its entries, per key its index entry)."""
    want = [_block(model, b) for b in blocks]
    entries = [list(model.index.get(k, ())) for k in keys]

    def check(shown: dict[str, Json]) -> list[str]:
        secondary, watched, index = shown.get("secondary"), shown.get("watched"), shown.get("index")
        counts = [len(shown[f]) for f in ("ref", "primary", "secondary", "watched") if f in shown]
        if counts != [len(blocks)] * len(counts) or (index is not None and len(index) != len(keys)):
            return [f"shown: entries for {counts} blocks, {len(index or ())} keys; named {len(blocks)} "
                    f"blocks, {len(keys)} keys"]
        diffs: list[str] = []
        for i, block in enumerate(want):
            got = (shown["ref"][i], shown["primary"][i],
                   None if secondary is None else secondary[i],
                   None if watched is None else watched[i])
            diffs += _block_diffs(f"shown (block {blocks[i]})", got, block)
        if index is not None:
            diffs += [f"shown.index (key …{keys[i][0][-3:].hex()}/g{keys[i][1]}): recorded "
                      f"{index[i]}, model {ids}"
                      for i, ids in enumerate(entries) if index[i] != ids or not _ids(index[i])]
        return diffs

    return check


def whole_view(model: Json) -> View:
    """Checks of a whole observation against the model's (``check-trace``'s comparison); the
    answer's observation is checked whole by the trace reader first (``whole``)."""
    def view(recorded: dict[str, Json]) -> list[str]:
        if all(value == model.get(name) for name, value in recorded.items()):
            return []  # read whole by the trace reader (kinds checked): equal is strictly equal
        return observation_diffs(recorded, model)

    view.whole = True  # type: ignore[attr-defined]
    return view


__all__ = ["View", "footprint", "footprint_view", "shown_view", "whole_view"]

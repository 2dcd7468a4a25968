"""Wrong specifications written by hand, one per kind: kept as named regressions of the judge.

Each is a small text edit of the specification: of the model only, of the z3 encoding only,
of both the same way (which no single-site mutant can be), of a caller contract (too weak or
too strong), or of the BMC's call domains.  The generated mutants (:mod:`.mutate`) are the
population the score is measured on; these are the stories the project's review told, and the
judge (:mod:`.judge`) must refute each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Named:
    """One wrong specification: edits as (file under the repository, old text, new text)."""

    name: str
    kind: str
    """``model``, ``z3``, ``both``, ``contract`` or ``domain``."""
    story: str
    edits: tuple[tuple[str, str, str], ...]


I4, I8, I12, I20 = " " * 4, " " * 8, " " * 12, " " * 20
MODEL_REVERSED_TAIL = ("model/pool.py", I4 + "s.free.push_tail(last)\n",
                       I4 + "s.free.push_tail(last[::-1])\n")
MODEL_RESET_KEEPS_WATCHERS = ("model/pool.py", I4 + "s.watchers.clear()\n", "")
MODEL_EVICT_SPARES = ("model/pool.py", I8 + 's.tell("evicted", b)\n' + I8 + "drop_hashes(s, b)\n",
                      I8 + 's.tell("evicted", b)\n' + I8 + "if s.ref[b] == 0:\n"
                      + I12 + "drop_hashes(s, b)\n")
Z3_EVICT_SPARES = ("proofs/transitions.py",
                   I4 + "return published(s, drop_hashes(s, b), entries_of(s, b), NO_ENTRIES)\n",
                   I4 + "return published(s, ite(s.ref[b] > 0, s, drop_hashes(s, b)),\n"
                   + I20 + " z3.If(s.ref[b] > 0, NO_ENTRIES, entries_of(s, b)), NO_ENTRIES)\n")
Z3_RESET_KEEPS_WATCHERS = ("proofs/transitions.py", I12 + "watched=z3.K(Block, z3.BoolVal(False)),\n"
                           + I12 + "live=z3.If(s.events, NO_ENTRIES, s.live),\n",
                           I12 + "live=z3.If(s.events, NO_ENTRIES, s.live),\n")

NAMED: tuple[Named, ...] = (
    Named("model_frees_cached_to_tail_reversed", "model",
           "free_blocks appends the cached blocks it frees to the tail in reverse order",
           (MODEL_REVERSED_TAIL,)),
    Named("model_reset_keeps_watchers", "model",
           "reset_prefix_cache fires its reuse watchers but keeps them registered",
           (MODEL_RESET_KEEPS_WATCHERS,)),
    Named("model_alloc_keeps_watcher", "model",
           "get_new_blocks tells a block's watcher but leaves it registered",
           (("model/pool.py", I12 + "s.fire(s.watchers.pop(b), b)\n", I12 + "s.fire(s.watchers[b], b)\n"),)),
    Named("model_evict_spares_blocks_in_use", "model",
           "evict_blocks leaves the entries of a block someone holds", (MODEL_EVICT_SPARES,)),
    Named("z3_alloc_keeps_watcher", "z3", "the z3 alloc step keeps the block's watcher",
           (("proofs/transitions.py", I8 + "watched=z3.Store(s.watched, b, False),\n", ""),)),
    Named("z3_announcement_may_double", "z3",
           "the z3 event property without 'an announcement never doubles a live one'",
           (("proofs/step_properties.py",
             I4 + "return z3.Implies(z3.And(st.pre, s.events), z3.And(fresh, matches))\n",
             I4 + "return z3.Implies(z3.And(st.pre, s.events), matches)\n"),)),
    Named("z3_alloc_takes_any_free_block", "z3",
           "the order encoding's allocation takes any free block, not the head",
           (("proofs/order.py", I8 + "pre=z3.And(b != NULL, s.free[b],\n"
             + I8 + "           z3.ForAll([_x], z3.Implies(s.free[_x], s.pos[b] <= s.pos[_x]))),\n",
             I8 + "pre=z3.And(b != NULL, s.free[b]),\n"),)),
    Named("z3_soundness_on_primary_keys_only", "z3",
           "the z3 index_entries_are_sound speaks of primary keys only",
           (("proofs/invariants.py",
             "z3.Implies(s.idx[_k, _b], prefix(s.names[_k], s.holds[_b]))",
             "z3.Implies(z3.And(s.idx[_k, _b], s.prim[_b], s.pkey[_b] == _k),\n"
             + I8 + "prefix(s.names[_k], s.holds[_b]))"),)),
    Named("both_evict_spares_blocks_in_use", "both",
           "model and z3 alike: evicting a block in use keeps its entries",
           (MODEL_EVICT_SPARES, Z3_EVICT_SPARES)),
    Named("both_reset_keeps_watchers", "both",
           "model and z3 alike: a reset keeps the reuse watchers",
           (MODEL_RESET_KEEPS_WATCHERS, Z3_RESET_KEEPS_WATCHERS)),
    Named("contract_insert_needs_no_holder", "contract",
           "too weak, model and z3 alike: _insert_block_hash into a block nobody holds",
           (("model/contracts.py", I4 + 'written_by_a_holder(s, block_id, "copy KV into it")\n', ""),
            ("proofs/transitions.py",
             I8 + "s.ref[b] >= 1,  # writes_extend_unless_writable: a holder copies into it\n", ""))),
    Named("contract_one_block_per_key", "contract",
           "too strong, model and z3 alike: a key in use may not be cached again, even for its own prefix",
           (("model/contracts.py", I4 + "if s.index.get(key) and s.names.get(key, prefix) is not prefix:\n",
             I4 + "if s.index.get(key):\n"),
            ("proofs/transitions.py",
             I4 + "return z3.Or(s.names[k] == c, z3.ForAll([_x], z3.Not(s.idx[k, _x])))\n",
             I4 + "return z3.ForAll([_x], z3.Not(s.idx[k, _x]))\n"))),
    Named("domain_never_replaces", "domain", "the BMC never calls with replace_existing_hashes=True",
           (("model/domains.py", I20 + "for rep in (False, True):\n", I20 + "for rep in (False,):\n"),
            ("model/domains.py", I20 + "if nt == len(r.all_token_ids) and g == scope.groups[0]:\n",
             I20 + "if False:\n"))),
    Named("domain_touches_one_block", "domain", "the BMC touches one block per call, never two",
           (("model/operations.py", "split=split.touch, domain=domains.free_blocks, queue=touched_queue),",
             "split=split.touch, domain=domains.single_lists, queue=touched_queue),"),)),
)


def edited(named: Named, root: Path) -> dict[str, str]:
    """Each file the wrong specification changes, with its edits applied (by path under ``root``)."""
    from .mutate import source

    out: dict[str, str] = {}
    for path, old, new in named.edits:
        text = out.get(path, source(path, root))
        if text.count(old) != 1:
            raise ValueError(f"{named.name}: {path} has {text.count(old)} copies of {old!r}")
        out[path] = text.replace(old, new)
    return out


__all__ = ["NAMED", "Named", "edited"]

"""Verify result documents (``kvpool.verify/1``) for the report tests.

Written from ``kvpool/VERIFY_SCHEMA.md``, not from ``kvpool verify``'s output, so
the renderer is tested against the documented contract.  The pictures are real:
they come from model states (``kvpool.pictures.picture_of_state``), and the
failing document's broken pool is the model's picture with one known fault
applied, so ``differs`` is what ``picture_differences`` says about them.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from kvpool.impl import Request, get_request_block_hasher
from kvpool.model import ACTIONS, INVARIANTS, Key, PoolState, initial_state
from kvpool.pictures import Label, labeller, picture_differences, picture_of_state

Doc = dict[str, Any]

NOT_ENCODED = {
    "usage_in_unit_interval": "a statement about len(free) / (num_blocks - 1): the abstraction keeps "
                              "free-queue membership, not its length",
    "no_events_when_disabled": "events are not part of the symbolic state",
}
STEPS = ["alloc", "release", "touch", "unpin", "evict", "reset", "cache_full", "cache_partial",
         "move", "identity"]
COVERS = {"get_new_blocks": ["alloc"], "free_blocks": ["release"], "touch": ["touch"],
          "cache_full_blocks": ["cache_full", "identity"], "move_block_hashes": ["move"]}
SCRIPT = "<script>alert('x')</script>"
"""Put into messages, calls and details: the report must show it, never run it."""

REFERENCE_DIFFERENCES = """\
# Where the reference versions differ

kvpool reproduces vLLM **0.31.0**'s `BlockPool`. A <b>tag</b> & an ampersand stay text.

## 1. The null block's counter

```
touch([null_block])          # 0.31.0 -> 1,  0.33.0 -> 0
free_blocks([null_block])    # <script>alert(1)</script>
```

- first item with `code`
- second item, see [the docs](https://example.invalid/docs)

1. numbered one
2. numbered two

| call | vLLM 0.31.0 | kvpool |
|---|---|---|
| `get_new_blocks(-1)` | inflates the free count | `InvalidArgumentError` |
| double free | counter goes negative | `BlockNotInUseError` |
"""


def _cell(rng: random.Random, status: str = "proven") -> dict[str, Any]:
    """One proof result with a plausible time."""
    return {"status": status, "seconds": round(rng.uniform(0.002, 0.4), 4)}


def _case(case_id: str, name: str, seconds: float, failure: Doc | None = None) -> Doc:
    """A JUnit case: ``ok`` exactly when there is no failure."""
    return {"id": case_id, "name": name, "ok": failure is None, "seconds": seconds, "failure": failure}


def _invariants() -> list[Doc]:
    """The model's real invariants, with the first line of each docstring."""
    return [{"name": name, "doc": (pred.__doc__ or "").strip().splitlines()[0],
             "encoded": name not in NOT_ENCODED} for name, pred in INVARIANTS.items()]


def _proofs(rng: random.Random) -> Doc:
    """A proofs phase where every check is proven."""
    encoded = [name for name in INVARIANTS if name not in NOT_ENCODED]
    matrix = {step: {inv: _cell(rng) for inv in encoded} for step in STEPS}
    cases = [_case(f"proofs/preserve/{step}/{inv}", f"{step} preserves {inv}", r["seconds"])
             for step, row in matrix.items() for inv, r in row.items()]
    return {"name": "proofs", "ok": True, "seconds": 14.2, "skipped": False, "cases": cases,
            "steps": list(STEPS), "matrix": matrix, "initial": {inv: _cell(rng) for inv in encoded},
            "enabled": {step: _cell(rng) for step in STEPS}, "not_encoded": dict(NOT_ENCODED),
            "covers": copy.deepcopy(COVERS)}


def _seeded_bugs() -> Doc:
    """Three seeded bugs, each refuted."""
    bugs = [
        {"name": "free_without_refcount_check",
         "story": "double free: vLLM's free_blocks decrements without checking, the count goes negative",
         "refuted_by": ["ref_counts_non_negative", "free_queue_holds_exactly_idle_blocks"],
         "method": "inductive"},
        {"name": "touch_leaves_block_free",
         "story": "a prefix-cache hit does not remove the block from the free queue",
         "refuted_by": ["free_queue_holds_exactly_idle_blocks"], "method": "inductive"},
        {"name": "counter_before_check", "story": "a counter updated before a refused check",
         "refuted_by": ["refusal changes nothing"], "method": "bmc"},
    ]
    cases = [_case(f"seeded-bugs/{b['name']}", f"{b['name']} is refuted", 0.2) for b in bugs]
    return {"name": "seeded-bugs", "ok": True, "seconds": 0.6, "skipped": False, "cases": cases,
            "bugs": bugs}


def _bmc() -> Doc:
    """Two bounded model checking runs, one exhausted, one stopped at its depth."""
    runs: list[Doc] = [
        {"name": "blocks=3,hbs=1", "blocks": 3, "hash_block_size": 1, "depth_target": 4, "depth": 4,
         "states": 12873, "transitions": 402117, "complete": True, "ok": True, "seconds": 8.1},
        {"name": "blocks=4,hbs=2", "blocks": 4, "hash_block_size": 2, "depth_target": 3, "depth": 3,
         "states": 5120, "transitions": 230400, "complete": False, "ok": True, "seconds": 6.4},
    ]
    cases = [_case(f"bmc/{r['name']}", f"BMC {r['name']}", r["seconds"]) for r in runs]
    return {"name": "bmc", "ok": True, "seconds": 14.5, "skipped": False, "cases": cases, "runs": runs}


def _lockstep() -> Doc:
    """A lockstep campaign against kvpool.impl."""
    ops = {"get_new_blocks": 1980, "free_blocks": 1740, "touch": 610, "cache_full_blocks": 1201,
           "cache_partial_block": 320, "get_cached_block": 2210, "evict_blocks": 41,
           "reset_prefix_cache": 12, "take_events": 400}
    return {"name": "lockstep", "ok": True, "seconds": 3.1, "skipped": False,
            "cases": [_case("lockstep/kvpool.impl", "lockstep kvpool.impl", 3.1)],
            "implementation": "kvpool.impl:BlockPool", "runs": 4, "calls": sum(ops.values()),
            "calls_per_second": round(sum(ops.values()) / 3.1, 1), "operations": ops,
            "errors": {"NotEnoughFreeBlocksError": 37, "BlockNotInUseError": 9, "InvalidArgumentError": 4},
            "configs": [{"seed": s, "num_blocks": 16 + 8 * s, "caching": s != 3, "hash_block_size": 4,
                         "events": s % 2 == 0} for s in range(4)]}


def _refinement() -> Doc:
    """Bounded refinement of kvpool.impl on two small pools."""
    runs: list[Doc] = [
        {"name": "4 blocks, hash_block_size 2, caching on, events on", "blocks": 4,
         "hash_block_size": 2, "caching": True, "events": True, "metrics": True, "depth_target": 2,
         "depth": 2, "complete": True, "ok": True, "states": 897, "sequences": 27203,
         "contract_breaches": 3096, "breaches": {"writes_extend_unless_writable": 1896},
         "operations": {"cache_full_blocks": 18397, "free_blocks": 1763},
         "misuse": {"free_blocks": 943, "touch": 328},
         "refusals": {"HASH_CONFLICT": 4956, "NOT_IN_USE": 1678},
         "copies": {"pickle": 41}, "seconds": 3.9},
        {"name": "4 blocks, hash_block_size 1, caching off, events on", "blocks": 4,
         "hash_block_size": 1, "caching": False, "events": True, "metrics": True, "depth_target": 3,
         "depth": 3, "complete": True, "ok": True, "states": 554, "sequences": 60588,
         "contract_breaches": 312, "breaches": {}, "operations": {"cache_full_blocks": 40000},
         "misuse": {"free_blocks": 5000}, "refusals": {"CACHING_DISABLED": 40000},
         "copies": {"pickle": 60}, "seconds": 8.2},
    ]
    cases = [_case(f"refinement/{i}", f"refinement {r['name']}", r["seconds"]) for i, r in enumerate(runs)]
    return {"name": "refinement", "ok": True, "seconds": 12.1, "skipped": False, "cases": cases,
            "implementation": "kvpool.impl:BlockPool", "symmetry": True, "runs": runs,
            "sequences": sum(r["sequences"] for r in runs), "states": sum(r["states"] for r in runs),
            "operations": {"cache_full_blocks": 58397, "free_blocks": 1763}}


def _target(name: str, spec: str, ok: bool = True) -> Doc:
    """A conformance target with its two phases."""
    return {"name": name, "spec": spec, "ok": ok, "seconds": 5.5,
            "phases": [{"name": "campaign", "ok": ok, "seconds": 4.0, "executed": 6000},
                       {"name": "machine", "ok": True, "seconds": 1.5, "executed": 50}]}


def _conformance(targets: list[Doc]) -> Doc:
    """A conformance phase over ``targets``; one case per target."""
    cases = [_case(f"conformance/{t['name']}", f"{t['name']} conforms", t["seconds"]) for t in targets]
    return {"name": "conformance", "ok": all(t["ok"] for t in targets), "seconds": 11.0,
            "skipped": False, "cases": cases, "targets": targets}


def _traces() -> Doc:
    """Two checked files, one trace and one event stream."""
    files: list[Doc] = [{"path": "runs/run.jsonl", "kind": "trace", "ok": True, "steps": 1500},
             {"path": "runs/events.jsonl", "kind": "events", "ok": True, "steps": 312}]
    return {"name": "traces", "ok": True, "seconds": 0.4, "skipped": False,
            "cases": [_case(f"traces/{f['path']}", f["path"], 0.2) for f in files], "files": files}


def passing_document() -> Doc:
    """Every phase passed."""
    rng = random.Random(0)
    return {
        "schema": "kvpool.verify/1", "kvpool_version": "0.1.0", "started": "2026-11-30T02:00:00+00:00",
        "seconds": 43.8, "profile": "ci",
        "budget": {"bmc_depth": 2, "bmc_seconds": 30, "steps": 2000, "runs": 4, "examples": 50,
                   "machine_steps": 25, "seed": 0, "timeout_ms": 30000},
        "ok": True, "exit_code": 0, "invariants": _invariants(),
        "reference_differences": REFERENCE_DIFFERENCES,
        "phases": [_proofs(rng), _seeded_bugs(), _bmc(), _lockstep(), _refinement(),
                   _conformance([_target("kvpool.impl", "kvpool.impl:BlockPool")]), _traces()],
    }


# --------------------------------------------------------------------------
# The failing document: a z3 counterexample, a BMC violation, a divergence.

Z3_MODEL = """\
[b = 2,
 k = Key!val!0,
 ref = [else -> 0],
 free = [2 -> False, else -> True],
 prim = [else -> Key!val!0],
 idx = [(Key!val!0, 2) -> True, else -> False]]"""


def _requests() -> tuple[list[Request], Label]:
    """Two requests sharing their first chunk, and labels naming keys by prefix."""
    hasher = get_request_block_hasher(2)
    reqs = [Request("r0", [1, 1, 2, 2, 3], block_hasher=hasher),
            Request("r1", [1, 1, 4, 4], block_hasher=hasher)]
    names: dict[Key, str] = {}
    for r in reqs:  # a shared prefix keeps the first request's name
        for i, h in enumerate(r.block_hashes):
            names.setdefault((h, 0), f"{r.request_id}[:{2 * (i + 1)}]/g0")
    return reqs, labeller(names)


def _step(index: int, call: str, outcome: str, changes: list[str], s: PoolState, label: Label) -> Doc:
    """A trace step showing the model state ``s`` after the call."""
    return {"index": index, "call": call, "outcome": outcome, "changes": changes,
            "picture": picture_of_state(s, label), "pool_picture": None, "differs": []}


def bmc_violation_trace() -> list[Doc]:
    """Allocation without lazy eviction: the old hash still serves the new owner's block."""
    (r0, _r1), label = _requests()
    s = initial_state(4, True, 2, events_on=True)
    s, got = ACTIONS["get_new_blocks"](s, 1)
    steps = [_step(1, "get_new_blocks(1)", str(got), ["ref 1: 0 -> 1", "free: [1, 2, 3] -> [2, 3]"],
                   s, label)]
    s, _ = ACTIONS["cache_full_blocks"](s, r0, [1], 0, 1, 2, 0)
    steps.append(_step(2, "cache_full_blocks(r0, [1], 0, 1, 2, 0)", "None",
                       ["primary 1: None -> r0[:2]/g0", "index: + r0[:2]/g0 -> [1]"], s, label))
    s, _ = ACTIONS["free_blocks"](s, [1])
    steps.append(_step(3, "free_blocks([1])", "None", ["ref 1: 1 -> 0", "free: [2, 3] -> [2, 3, 1]"],
                       s, label))
    s, got = ACTIONS["get_new_blocks"](s, 3)
    last = _step(4, "get_new_blocks(3)", str(got), ["ref 1: 0 -> 1", "free: [2, 3, 1] -> []"], s, label)
    # The seeded bug keeps block 1's old key and index entry while it is handed out.
    picture = last["picture"]
    picture["blocks"][1].update(key="r0[:2]/g0", tokens=2)
    picture["index"] = [{"key": "r0[:2]/g0", "blocks": [1]}]
    steps.append(last)
    return steps


def divergence_trace() -> list[Doc]:
    """A pool that frees hashed blocks to the head of the queue (evicted first, not last)."""
    (r0, _r1), label = _requests()
    s = initial_state(5, True, 2, events_on=True)
    s, got = ACTIONS["get_new_blocks"](s, 2)
    steps = [_step(1, "get_new_blocks(2)", str(got), ["ref 1: 0 -> 1", "ref 2: 0 -> 1"], s, label)]
    s, _ = ACTIONS["cache_full_blocks"](s, r0, [1, 2], 0, 2, 2, 0)
    steps.append(_step(2, "cache_full_blocks(r0, [1, 2], 0, 2, 2, 0)", "None",
                       ["index: + r0[:2]/g0 -> [1]", "index: + r0[:4]/g0 -> [2]"], s, label))
    s, _ = ACTIONS["unpin_blocks"](s, [2], lambda _b: None)
    s, _ = ACTIONS["touch"](s, [2])
    steps.append(_step(3, f"unpin_blocks([2], on_reuse); touch([2]) {SCRIPT}", "None",
                       ["watched: + 2"], s, label))
    s, _ = ACTIONS["free_blocks"](s, [2, 1])
    last = _step(4, "free_blocks([2, 1])", "None",
                 ["ref 2: 1 -> 0", "ref 1: 1 -> 0", "free: [3, 4] -> [3, 4, 2, 1]"], s, label)
    pool = copy.deepcopy(last["picture"])
    pool["free"] = [2, 1, 3, 4]  # the broken pool puts hashed blocks at the head
    for block in pool["blocks"]:
        block["free_pos"] = pool["free"].index(block["id"]) if block["id"] in pool["free"] else None
    last["pool_picture"] = pool
    last["differs"] = picture_differences(last["picture"], pool)
    steps.append(last)
    return steps


def failing_document() -> Doc:
    """One failure per kind a reviewer must read: z3 model, BMC trace, divergence."""
    doc = passing_document()
    doc.update(ok=False, exit_code=1)
    phases = {p["name"]: p for p in doc["phases"]}

    proofs = phases["proofs"]
    proofs["ok"] = False
    proofs["matrix"]["move"]["index_entries_are_sound"] = {"status": "counterexample", "seconds": 0.731}
    proofs["matrix"]["cache_partial"]["primary_covers_whole_chunks"] = {"status": "unknown",
                                                                        "seconds": 30.0}
    for case in proofs["cases"]:
        if case["id"] == "proofs/preserve/move/index_entries_are_sound":
            case.update(ok=False, seconds=0.731, failure={
                "kind": "counterexample",
                "message": "move does not preserve index_entries_are_sound",
                "details": Z3_MODEL, "trace": []})

    bmc = phases["bmc"]
    bmc["ok"] = False
    bmc["runs"][1].update(ok=False, depth=4, depth_target=6, complete=False)
    bmc["cases"][1].update(ok=False, failure={
        "kind": "violation",
        "message": "writable_blocks_are_unindexed violated after 4 calls",
        "details": ("seeded bug alloc_keeps_old_hash\n"
                    "block 1 is writable by its owner but indexed as r0[:2]/g0"),
        "trace": bmc_violation_trace()})

    target = _target("pools.FreeHashedToHead", "kvpool.bugs.pools:FreeHashedToHead", ok=False)
    conformance = _conformance([_target("kvpool.impl", "kvpool.impl:BlockPool"), target])
    conformance["cases"][1].update(ok=False, failure={
        "kind": "divergence",
        "message": f"free queue differs after free_blocks([2, 1]) {SCRIPT}",
        "details": f"model free: [3, 4, 2, 1]\npool  free: [2, 1, 3, 4]\n{SCRIPT}",
        "trace": divergence_trace()})
    doc["phases"] = [conformance if p["name"] == "conformance" else p for p in doc["phases"]]
    return doc

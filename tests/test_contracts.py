"""The caller contracts: the model names each broken one and changes nothing.

Each contract the proofs assume (:data:`kvpool.model.CONTRACTS`) is checked
by the model, which raises :class:`ContractBroken` (a verdict about the
caller, not the pool) and leaves the state as it was; a call that keeps them
is accepted.  Actions update a state in place: :func:`_call` applies each to a copy, so a
state can be the start of several calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.impl.hashing import get_request_block_hasher
from kvpool.impl.request import Request
from kvpool.model import ACTIONS, CALLER_ACTIONS, CONTRACTS, ContractBroken, initial_state, violated
from kvpool.model.refusals import Refusal, RefusalKind
from kvpool.model.request import EMPTY, compatible, extends
from kvpool.model.state import PoolState


def _request(rid: str, tokens: list[int], hbs: int = 1) -> Request:
    return Request(rid, tokens, block_hasher=get_request_block_hasher(hbs))


def _call(s: PoolState, op: str, *args: Any) -> PoolState:
    """``op`` on a copy of ``s`` (``s`` stays as it was), which keeps every invariant."""
    fn = ACTIONS.get(op) or CALLER_ACTIONS[op]
    nxt, _ = fn(s.copy(), *args)
    assert violated(nxt) == []
    return nxt


def _broken(s: PoolState, contract: str, op: str, *args: Any, says: str | None = None) -> None:
    """``op`` on ``s`` breaks ``contract`` (saying ``says``, when given) and changes nothing."""
    fn = ACTIONS.get(op) or CALLER_ACTIONS[op]
    before = s.copy()
    with pytest.raises(ContractBroken) as caught:
        fn(s, *args)
    assert caught.value.contract == contract
    assert str(caught.value).startswith(f"caller broke {contract}: ")
    assert says is None or str(caught.value) == f"caller broke {contract}: {says}"
    assert s == before


A = _request("a", [1, 2, 3, 4])
B = _request("b", [9, 8, 7, 6])


def _held(n: int = 1, *, events: bool = True) -> PoolState:
    s = initial_state(5, True, 1, events)
    return _call(s, "get_new_blocks", n)


def test_every_contract_is_named_in_one_line() -> None:
    assert set(CONTRACTS) == {"hashes_name_one_prefix", "writes_extend_unless_writable",
                              "replaced_by_its_sole_owner", "moves_onto_the_callers_copy",
                              "cached_once_per_call"}
    assert all(text and "\n" not in text for text in CONTRACTS.values())


def test_the_issues_stale_partial_entry_is_a_broken_contract() -> None:
    """cache_partial_block(a[:3]) then (b[:1]) on one block: refused as the caller's fault."""
    s = _call(_held(), "cache_partial_block", A, 1, 3, 0, 4)
    _broken(s, "writes_extend_unless_writable", "cache_partial_block", B, 1, 1, 0, 4)
    # with replace_existing_hashes its sole owner may do it, and the old entry goes
    s = _call(s, "cache_partial_block", B, 1, 1, 0, 4, True)
    assert list(s.index) == [(B.block_hashes[0], 0)]


def test_a_hashed_block_takes_only_extensions_of_what_it_holds() -> None:
    s = _call(_held(), "cache_partial_block", A, 1, 2, 0, 4)
    s = _call(s, "cache_partial_block", A, 1, 3, 0, 4)  # the same request, further: fine
    s = _call(s, "write_block", 1, A, 4)  # the owner keeps writing its own tokens
    assert len(s.holds[1]) == 4 and s.holds[1].up_to(3) is s.names[(A.block_hashes[2], 0)]
    _broken(s, "writes_extend_unless_writable", "write_block", 1, B, 2)


def test_a_writable_block_takes_any_write_from_its_owner() -> None:
    s = _call(_held(), "write_block", 1, A, 3)
    s = _call(s, "write_block", 1, B, 2)  # unhashed, one owner: rewriting is its right
    s = _call(s, "cache_partial_block", B, 1, 2, 0, 4)
    assert s.holds[1] is s.names[(B.block_hashes[1], 0)]


def test_writes_need_a_holder() -> None:
    s = _held()
    _broken(s, "writes_extend_unless_writable", "write_block", 2, A, 1,  # block 2 is free
            says="block 2 has no holder to write into it")
    _broken(s, "writes_extend_unless_writable", "write_block", 0, A, 1)  # the null block


def test_a_write_past_the_requests_tokens_is_refused_as_an_invalid_argument() -> None:
    s = _held()
    with pytest.raises(Refusal, match=r"^request has only 4 tokens$") as refused:
        CALLER_ACTIONS["write_block"](s.copy(), 1, A, 5)
    assert refused.value.kind is RefusalKind.INVALID_ARGUMENT


def test_a_shared_block_is_not_writable() -> None:
    s = _call(_call(_held(), "write_block", 1, A, 2), "touch", [1])
    _broken(s, "writes_extend_unless_writable", "write_block", 1, B, 2,
            says="block 1 holds a prefix that 2 written chunk(s) do not extend, and it is not writable")
    _call(s, "write_block", 1, A, 3)  # an extension is still fine


def test_only_the_sole_owner_replaces() -> None:
    s = _call(_held(), "cache_partial_block", A, 1, 3, 0, 4)
    shared = _call(s, "touch", [1])
    _broken(shared, "replaced_by_its_sole_owner", "cache_partial_block", B, 1, 1, 0, 4, True,
            says="block 1 has 2 references, not one")
    idle = _call(s, "free_blocks", [1])
    _broken(idle, "replaced_by_its_sole_owner", "cache_partial_block", B, 1, 1, 0, 4, True,
            says="block 1 has 0 references, not one")


def test_moves_go_onto_the_callers_own_copy() -> None:
    s = _call(_held(2), "cache_full_blocks", A, [1], 0, 1, 1, 0)
    s = _call(s, "touch", [2])  # block 2 now has two holders
    _broken(s, "moves_onto_the_callers_copy", "move_block_hashes", 1, 2)
    _broken(s, "moves_onto_the_callers_copy", "move_block_hashes", 1, 3,  # free, nobody's copy
            says="block 3 has 0 references: it is not the caller's own copy")
    s = _call(s, "free_blocks", [2])
    s = _call(s, "move_block_hashes", 1, 2)
    assert s.index == {(A.block_hashes[0], 0): (2,)}
    assert s.announced == {((A.block_hashes[0], 0), 2)}


def test_a_colliding_hash_is_a_broken_contract() -> None:
    s = _call(_held(2), "cache_full_blocks", A, [1], 0, 1, 1, 0)
    liar = Request("liar", [5], block_hasher=None)
    liar.block_hashes.append(A.block_hashes[0])  # names a's prefix, holds other tokens
    _broken(s, "hashes_name_one_prefix", "cache_full_blocks", liar, [2], 0, 1, 1, 0)
    _broken(s, "hashes_name_one_prefix", "cache_partial_block", liar, 2, 1, 0, 4)
    _broken(s, "hashes_name_one_prefix", "_insert_block_hash", liar, 1, 0, 2, 1,
            says=f"key …{A.block_hashes[0][-3:].hex()}/g0 already names another prefix")
    # another group is another key: no collision
    _call(s, "_insert_block_hash", liar, 1, 1, 2, 1)
    _call(s, "cache_full_blocks", A, [2], 0, 1, 1, 1)


def test_an_insert_copies_into_a_held_block() -> None:
    s = _held()
    _broken(s, "writes_extend_unless_writable", "_insert_block_hash", A, 1, 0, 2, 1,  # block 2 is free
            says="block 2 has no holder to copy KV into it")


def test_one_call_caches_a_block_at_one_position() -> None:
    """vLLM would announce the first position's key after removing it (a router's count drifts)."""
    s = _held()
    _broken(s, "cached_once_per_call", "cache_full_blocks", A, [1, 1], 0, 2, 1, 0,
            says="blocks [1, 1] list one block at two positions")
    _call(s, "cache_full_blocks", A, [1, 0], 0, 2, 1, 0)  # the null block may repeat
    _call(s, "cache_full_blocks", A, [1, 1], 0, 2, 1, 0, [True, False])  # masked out: one position


def test_refusals_come_before_contracts() -> None:
    """A call the pool itself would refuse is a refusal, whatever the caller's contracts."""
    from kvpool.model import Refusal

    s = _call(_held(), "cache_partial_block", A, 1, 3, 0, 4)
    with pytest.raises(Refusal):
        ACTIONS["cache_partial_block"](s, B, 9, 1, 0, 4)  # unknown block


def test_prefix_relations() -> None:
    b = EMPTY.then(((1,), None))
    a = b.then(((2,), None))
    assert extends(a, b) and not extends(b, a)
    assert compatible(a, b) and compatible(b, a) and compatible(EMPTY, a)
    assert not compatible(a, EMPTY.then(((2,), None)))
    assert EMPTY.then(((1,), None)).then(((2,), None)) is a  # interned: equal prefixes are one object
    assert repr(a) == "(((1,), None), ((2,), None))" and repr(EMPTY) == "()"  # counterexamples print chunks


# --------------------------------------------------------------------------
# The oracle's verdict: the caller broke a contract (not: the pool diverged).


def test_the_lockstep_names_the_broken_contract_and_does_not_run_the_call() -> None:
    from kvpool.impl import BlockPool
    from kvpool.oracle.core.lockstep import CallerBrokeContract, Lockstep

    pair = Lockstep.fresh(BlockPool, 5, True, 1, True)
    pair.call("get_new_blocks", 1)
    pair.call("cache_partial_block", A, 1, 3, 0, 4)
    before = pair.pool.blocks[1].block_hash
    with pytest.raises(CallerBrokeContract) as caught:
        pair.call("cache_partial_block", B, 1, 1, 0, 4)
    assert str(caught.value).startswith("caller broke writes_extend_unless_writable at step 3: ")
    assert caught.value.contract == "writes_extend_unless_writable" and caught.value.step == 3
    assert caught.value.parts == ["contract"]
    assert pair.pool.blocks[1].block_hash == before  # the pool never saw the call


def test_conform_counts_a_broken_contract_as_the_callers_fault() -> None:
    from kvpool.cli.conform import exit_code
    from kvpool.oracle.core.lockstep import CallerBrokeContract, Divergence
    from kvpool.oracle.search.conform import Failure, PhaseResult, _failure

    broke = _failure(CallerBrokeContract("caller broke x at step 1: why", "x", 1), None, 0)
    assert broke.kind == "contract"
    diverged = _failure(Divergence("result: model 1 | pool 2"), None, 0)
    assert diverged.kind == "divergence"

    def phase(f: Failure | None) -> PhaseResult:
        return PhaseResult("campaign", f is None, 0.0, 1, f)

    assert exit_code([phase(None)]) == 0
    assert exit_code([phase(broke), phase(None)]) == 3
    assert exit_code([phase(broke), phase(diverged)]) == 1


def test_check_trace_reports_the_callers_broken_contract(tmp_path: Any) -> None:
    """A pool that accepted the issue's stale write: the trace's verdict names the caller."""
    import copy
    import json

    from kvpool.cli.trace import check_trace_main
    from kvpool.impl import BlockPool
    from kvpool.oracle.trace import check_trace
    from kvpool.oracle.trace.record import Recording, recording_pair

    pair, header = recording_pair(BlockPool, 5, True, 1, True)
    pair.call("get_new_blocks", 1)
    pair.call("cache_partial_block", A, 1, 3, 0, 4)
    stale = copy.deepcopy(pair.lines[-1])
    stale["args"]["request"]["all_token_ids"] = list(B.all_token_ids)
    stale["args"]["request"]["block_hashes"] = [h.hex() for h in B.block_hashes]
    stale["args"]["num_tokens"] = 1
    stale["result"], stale["events"], stale["observation"] = None, None, None
    path = tmp_path / "stale.jsonl"
    Recording(header, [*pair.lines, stale], None).write(path)
    report = check_trace(path)
    assert not report.ok and report.divergence is None and report.contract is not None
    assert report.contract.step == 3 and report.contract.contract == "writes_extend_unless_writable"
    assert "caller broke writes_extend_unless_writable at step 3" in report.format()
    assert check_trace_main([str(path)]) == 3
    assert json.loads(path.read_text().splitlines()[0])["num_blocks"] == 5

"""A pool that shares nothing with kvpool, checked against kvpool's pool.

``tests/third_party/mypool.py`` is written as another engine's author would
write a vLLM-compatible pool: standard library only, its own internals.  These
sanity tests drive it and kvpool's pool through the same hand-written
scenarios and compare everything a caller can see through the public API:
results, ref counts, the free queue in order, primary keys, lookups of every
hash of every request, events field by field, reuse-watcher and
metrics-collector calls.  Each broken variant in ``mypool_bugs.py`` must
differ from the correct pool on at least one scenario.

Requests come from kvpool (``Request``, ``get_request_block_hasher``): the
test builds them, the third-party pool only reads their attributes.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kvpool.impl as kv
from kvpool.impl import LoRARequest, MultiModalFeature, PlaceholderRange, Request, get_request_block_hasher
from kvpool.oracle.core.lockstep import MetricsRecorder

THIRD_PARTY = Path(__file__).parent / "third_party"


def _load(name: str) -> ModuleType:
    """Import a module of tests/third_party by path (the tests are no package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, THIRD_PARTY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


mypool = _load("mypool")
mypool_bugs = _load("mypool_bugs")

# ------------------------------------------------------------------ harness


class Recorder(MetricsRecorder):
    """Metrics collector and reuse watchers in one: every call, in order."""

    def watcher(self, tag: str) -> Callable[[Any], None]:
        return lambda block: self.log.append((f"reuse {tag}", block.block_id))

    def take(self) -> list[tuple[str, int | None]]:
        calls, self.log = self.log, []
        return calls


def event_fields(event: Any) -> dict[str, Any]:
    """An event as its class name and fields: the classes differ between pools."""
    return {"type": type(event).__name__, **dataclasses.asdict(event)}


def as_ids(value: Any) -> Any:
    """A call's result with blocks replaced by their ids."""
    if isinstance(value, list):
        return [as_ids(v) for v in value]
    return value.block_id if hasattr(value, "block_id") else value


class Run:
    """One pool (plus a small second one for cross-pool frees) and the trace of a scenario."""

    def __init__(self, factory: Callable[..., Any], num_gpu_blocks: int = 10, hash_block_size: int = 4,
                 enable_caching: bool = True, groups: tuple[int, ...] = (0,)) -> None:
        self.rec = Recorder()
        self.pool = factory(num_gpu_blocks=num_gpu_blocks, enable_caching=enable_caching,
                            hash_block_size=hash_block_size, enable_kv_cache_events=True,
                            metrics_collector=self.rec)
        self.other = factory(num_gpu_blocks=4, enable_caching=enable_caching,
                             hash_block_size=hash_block_size)
        self.groups = groups
        self.requests: list[Request] = []
        self.trace: list[tuple[Any, ...]] = []

    def request(self, tokens: list[int], **kw: Any) -> Request:
        req = Request(f"r{len(self.requests)}", tokens,
                      block_hasher=get_request_block_hasher(self.pool.hash_block_size), **kw)
        self.requests.append(req)
        return req

    def __call__(self, label: str, call: Callable[[Any], Any]) -> Any:
        """Make one call on the pool and record what a caller could see afterwards."""
        try:
            out = call(self.pool)
            result = as_ids(out)
        except Exception as exc:  # a bug variant may raise where the reference does not
            out = None
            result = ("raised", "ValueError" if isinstance(exc, ValueError) else type(exc).__name__,
                      str(exc) if isinstance(exc, ValueError) else "")
        self.trace.append((label, result, self.observe(), self.rec.take()))
        return out

    def observe(self) -> dict[str, Any]:
        p = self.pool
        lookups = {}
        for req in self.requests:
            for h in req.block_hashes:
                for g in self.groups:
                    lookups[(h, g)] = as_ids(p.get_cached_block(h, [g]))
                lookups[(h, self.groups)] = as_ids(p.get_cached_block(h, list(self.groups)))
        return {
            "ref": [b.ref_cnt for b in p.blocks],
            "free": [b.block_id for b in p.free_block_queue.get_all_free_blocks()],
            "num_free": (p.get_num_free_blocks(), p.free_block_queue.num_free_blocks),
            "usage": p.get_usage(),
            "primary": [(b.block_hash, b.block_hash_num_tokens) for b in p.blocks],
            "null": (p.null_block.block_id, [b.is_null for b in p.blocks]),
            "writable": [p.is_block_writable(b) for b in p.blocks],
            "lookups": lookups,
            "events": [event_fields(e) for e in p.take_events()],
            "other": ([b.ref_cnt for b in self.other.blocks],
                      [b.block_id for b in self.other.free_block_queue.get_all_free_blocks()]),
        }


Scenario = Callable[[Run], None]
SCENARIOS: dict[str, tuple[Scenario, dict[str, Any]]] = {}


def scenario(**config: Any) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[fn.__name__] = (fn, config)
        return fn
    return register


def run(factory: Callable[..., Any], name: str) -> list[tuple[Any, ...]]:
    fn, config = SCENARIOS[name]
    r = Run(factory, **config)
    fn(r)
    return r.trace


# ---------------------------------------------------------------- scenarios


@scenario()
def allocation_order(r: Run) -> None:
    r("new 3", lambda p: p.get_new_blocks(3))
    r("new 0", lambda p: p.get_new_blocks(0))
    r("new 2", lambda p: p.get_new_blocks(2))
    r("too many", lambda p: p.get_new_blocks(5))
    r("the rest", lambda p: p.get_new_blocks(4))


@scenario()
def free_order_head_and_tail(r: Run) -> None:
    req = r.request(list(range(10)))
    blocks = r("new 5", lambda p: p.get_new_blocks(5))
    r("cache 2", lambda p: p.cache_full_blocks(req, blocks, 0, 2, 4, 0))
    r("free reversed", lambda p: p.free_blocks(list(reversed(blocks))))
    r("new 4 takes the unhashed first", lambda p: p.get_new_blocks(4))


@scenario(enable_caching=False)
def free_order_without_caching(r: Run) -> None:
    blocks = r("new 4", lambda p: p.get_new_blocks(4))
    r("free 2", lambda p: p.free_blocks([blocks[1], blocks[3]]))
    r("free 2 more", lambda p: p.free_blocks([blocks[0], blocks[2]]))
    r("new 3", lambda p: p.get_new_blocks(3))


@scenario()
def prefix_hit_with_touch(r: Run) -> None:
    first = r.request(list(range(14)), session_id="s1")
    blocks = r("new 4", lambda p: p.get_new_blocks(4))
    r("cache 3", lambda p: p.cache_full_blocks(first, blocks, 0, 3, 4, 0))
    r("free", lambda p: p.free_blocks(list(reversed(blocks))))
    second = r.request([*range(12), 99, 98, 97, 96], session_id="s2")
    hit = [r(f"lookup {i}", lambda p, h=h: p.get_cached_block(h, [0])) for i, h in
           enumerate(second.block_hashes[:3])]
    r("touch the hit", lambda p: p.touch([b[0] for b in hit]))
    r("touch again (in use)", lambda p: p.touch([hit[0][0]]))
    r("emit hit events", lambda p: p.emit_cached_block_events(second, 3, 4, 0))
    r("free the hit", lambda p: p.free_blocks([b[0] for b in reversed(hit)] + [hit[0][0]]))


@scenario()
def duplicate_listing_in_one_free(r: Run) -> None:
    a, b, c = r("new 3", lambda p: p.get_new_blocks(3))
    r("share a", lambda p: p.touch([a]))
    r("free a, b, a", lambda p: p.free_blocks([a, b, a]))
    r("share c", lambda p: p.touch([c]))
    r("free c, c", lambda p: p.free_blocks([c, c]))
    r("new 9", lambda p: p.get_new_blocks(9))


@scenario(hash_block_size=4, groups=(0, 1))
def partial_entries_and_promotion(r: Run) -> None:
    req = r.request(list(range(20)), lora_request=LoRARequest("ad", 7, "/ad"))
    blocks = r("new 3", lambda p: p.get_new_blocks(3))
    r("cache 2 at 8", lambda p: p.cache_full_blocks(req, blocks, 0, 2, 8, 1))
    r("partial at 20", lambda p: p.cache_partial_block(req, blocks[2], 20, 1, 8))
    r("partial again: known", lambda p: p.cache_partial_block(req, blocks[2], 20, 1, 8))
    req.append_output_token_ids([50, 51, 52, 53, 54])
    r("promote", lambda p: p.cache_full_blocks(req, blocks, 2, 3, 8, 1))
    r("partial under a longer key: secondary", lambda p: p.cache_partial_block(req, blocks[2], 20, 1, 8))
    r("partial in group 0", lambda p: p.cache_partial_block(req, blocks[2], 20, 0, 8))
    r("replace", lambda p: p.cache_partial_block(req, blocks[1], 12, 1, 8, replace_existing_hashes=True))
    r("free", lambda p: p.free_blocks(list(reversed(blocks))))
    r("reuse evicts lazily", lambda p: p.get_new_blocks(9))


@scenario(hash_block_size=4, num_gpu_blocks=6)
def secondary_keys_and_eviction(r: Run) -> None:
    req = r.request(list(range(24)))
    blocks = r("new 2", lambda p: p.get_new_blocks(2))
    r("cache 1 at 12", lambda p: p.cache_full_blocks(req, blocks, 0, 1, 12, 0))
    r("partial at 20", lambda p: p.cache_partial_block(req, blocks[1], 20, 0, 12))
    r("promote", lambda p: p.cache_full_blocks(req, blocks, 1, 2, 12, 0))
    r("secondary at 16", lambda p: p.cache_partial_block(req, blocks[1], 16, 0, 12))
    r("secondary at 20", lambda p: p.cache_partial_block(req, blocks[1], 20, 0, 12))
    r("evict in use", lambda p: p.evict_blocks([blocks[1].block_id, 4]))
    r("free", lambda p: p.free_blocks(list(reversed(blocks))))
    r("evict idle", lambda p: p.evict_blocks({blocks[0].block_id}))
    r("new 5", lambda p: p.get_new_blocks(5))


@scenario()
def duplicate_keys_and_lookup_order(r: Run) -> None:
    req = r.request(list(range(8)))
    a = r("new 2", lambda p: p.get_new_blocks(2))
    b = r("new 2 more", lambda p: p.get_new_blocks(2))
    r("cache a", lambda p: p.cache_full_blocks(req, a, 0, 2, 4, 0))
    r("cache b under the same keys", lambda p: p.cache_full_blocks(req, b, 0, 2, 4, 0))
    r("evict a[0]", lambda p: p.evict_blocks([a[0].block_id]))
    r("cache a[0] again", lambda p: p.cache_full_blocks(req, a, 0, 1, 4, 0))
    r("free all", lambda p: p.free_blocks(a + b))
    r("new 1", lambda p: p.get_new_blocks(1))


@scenario(hash_block_size=4, num_gpu_blocks=6)
def move_block_hashes(r: Run) -> None:
    req = r.request(list(range(12)))
    blocks = r("new 2", lambda p: p.get_new_blocks(2))
    r("cache 1 at 8", lambda p: p.cache_full_blocks(req, blocks, 0, 1, 8, 0))
    r("partial at 12", lambda p: p.cache_partial_block(req, blocks[1], 12, 0, 8))
    dst = r("copy target", lambda p: p.get_new_blocks(1))
    r("move", lambda p: p.move_block_hashes(blocks[1], dst[0]))
    r("src is writable again", lambda p: p.is_block_writable(blocks[1]))
    r("move unhashed", lambda p: p.move_block_hashes(blocks[1], p.blocks[5]))
    r("free", lambda p: p.free_blocks(blocks + dst))


@scenario(hash_block_size=4, num_gpu_blocks=12)
def events_with_extra_keys(r: Run) -> None:
    mm = [MultiModalFeature(f"img{i}", PlaceholderRange(offset, length))
          for i, (offset, length) in enumerate([(2, 3), (6, 9), (17, 2)])]
    req = r.request(list(range(26)), lora_request=LoRARequest("ad", 3, "/p"), mm_features=mm,
                    cache_salt="salt", session_id="sess", prompt_embeds=bytes(range(26)))
    blocks = r("new 4", lambda p: p.get_new_blocks(4))
    r("cache 1 at 8", lambda p: p.cache_full_blocks(req, blocks, 0, 1, 8, 2))
    r("cache 2 more at 8", lambda p: p.cache_full_blocks(req, blocks, 1, 3, 8, 2))
    r("partial at 20 (mm window)", lambda p: p.cache_partial_block(req, blocks[3], 28 - 8, 2, 8))
    r("emit hit at 8", lambda p: p.emit_cached_block_events(req, 3, 8, 2))
    r("emit hit at 4", lambda p: p.emit_cached_block_events(req, 6, 4, 0))
    r("emit zero", lambda p: p.emit_cached_block_events(req, 0, 4, 0))
    r("nothing new", lambda p: p.cache_full_blocks(req, blocks, 3, 3, 8, 2))
    plain = r.request(list(range(100, 112)))
    more = r("new 3", lambda p: p.get_new_blocks(3))
    r("mask and null", lambda p: p.cache_full_blocks(plain, [more[0], p.null_block, more[1]], 0, 3, 4, 0,
                                                      block_mask=[True, True, False]))
    r("all masked", lambda p: p.cache_full_blocks(plain, more, 2, 3, 4, 0, block_mask=[False]))


@scenario(num_gpu_blocks=6)
def watchers_and_unpin(r: Run) -> None:
    req = r.request(list(range(8)))
    blocks = r("new 3", lambda p: p.get_new_blocks(3))
    r("cache 1", lambda p: p.cache_full_blocks(req, blocks, 0, 1, 4, 0))
    r("share b1", lambda p: p.touch([blocks[1]]))
    r("unpin (hashed too: tail)",
      lambda p: p.unpin_blocks([blocks[0], blocks[1], blocks[1]], r.rec.watcher("x")))
    r("unpin b2, new watcher", lambda p: p.unpin_blocks([blocks[2]], r.rec.watcher("y")))
    r("hit b0", lambda p: p.touch([blocks[0]]))
    r("free b0", lambda p: p.free_blocks([blocks[0]]))
    r("new 3 reuses b-watched", lambda p: p.get_new_blocks(3))
    r("new 2", lambda p: p.get_new_blocks(2))


@scenario(num_gpu_blocks=6)
def reset_prefix_cache(r: Run) -> None:
    req = r.request(list(range(8)))
    blocks = r("new 2", lambda p: p.get_new_blocks(2))
    r("cache 2", lambda p: p.cache_full_blocks(req, blocks, 0, 2, 4, 0))
    r("reset refused while in use", lambda p: p.reset_prefix_cache())
    r("unpin b1", lambda p: p.unpin_blocks([blocks[1]], r.rec.watcher("w")))
    r("free b0", lambda p: p.free_blocks([blocks[0]]))
    r("reset", lambda p: p.reset_prefix_cache())
    r("reset again", lambda p: p.reset_prefix_cache())
    r("new 5", lambda p: p.get_new_blocks(5))


@scenario()
def null_block_and_other_pools(r: Run) -> None:
    blocks = r("new 2", lambda p: p.get_new_blocks(2))
    theirs = r.other.get_new_blocks(2)
    r("touch null", lambda p: p.touch([p.null_block]))
    r("free mixed pools", lambda p: p.free_blocks([theirs[1], blocks[0], p.null_block, theirs[0], blocks[1]]))
    r("free null again", lambda p: p.free_blocks([p.null_block]))
    r("usage", lambda p: p.get_usage())


@scenario(num_gpu_blocks=1)
def only_the_null_block(r: Run) -> None:
    r("usage", lambda p: p.get_usage())
    r("new 1", lambda p: p.get_new_blocks(1))
    r("reset", lambda p: p.reset_prefix_cache())


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_third_party_pool_matches_kvpool(name: str) -> None:
    theirs, ours = run(kv.BlockPool, name), run(mypool.BlockPool, name)
    for step_kv, step_mine in zip(theirs, ours, strict=True):
        assert step_mine == step_kv, f"first difference at step {step_kv[0]!r}"


# Each variant, the scenario that shows it, and the step where it must first differ.
BUG_SHOWS_AT = {
    "QueuesPerListing": ("duplicate_listing_in_one_free", "free a, b, a"),
    "CachedFreedToHead": ("free_order_head_and_tail", "free reversed"),
    "TouchLeavesQueued": ("prefix_hit_with_touch", "touch the hit"),
    "ForgetsLazyEviction": ("partial_entries_and_promotion", "reuse evicts lazily"),
    "StoredWithoutLoraId": ("partial_entries_and_promotion", "cache 2 at 8"),
    "EvictKeepsSecondaryKeys": ("secondary_keys_and_eviction", "evict in use"),
}


def test_every_bug_variant_is_listed() -> None:
    base = mypool.BlockPool
    variants = {name for name, obj in vars(mypool_bugs).items()
                if isinstance(obj, type) and issubclass(obj, base) and obj is not base}
    assert variants == set(BUG_SHOWS_AT)


@pytest.mark.parametrize("bug", sorted(BUG_SHOWS_AT))
def test_bug_variant_differs_from_the_correct_pool(bug: str) -> None:
    name, step = BUG_SHOWS_AT[bug]
    broken, correct = run(getattr(mypool_bugs, bug), name), run(mypool.BlockPool, name)
    first = next((b[0] for b, c in zip(broken, correct, strict=True) if b != c), None)
    assert first == step


def test_event_classes_have_vllm_field_names_in_order() -> None:
    for cls in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        ours = [f.name for f in dataclasses.fields(getattr(mypool, cls))]
        assert ours == [f.name for f in dataclasses.fields(getattr(kv, cls))]


def test_third_party_pool_imports_only_the_standard_library() -> None:
    for path in (THIRD_PARTY / "mypool.py", THIRD_PARTY / "mypool_bugs.py",
                 THIRD_PARTY / "mypool_interactions.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]} if node.level == 0 else {"."}
            else:
                continue
            assert roots <= set(sys.stdlib_module_names) | {"__future__", "mypool"}, (path.name, roots)
        assert "kvpool" not in path.read_text()


def test_internals_are_not_vllms() -> None:
    pool = mypool.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    for name in ("_cache", "cached_block_hash_to_block", "cached_block_hashes_by_block",
                 "_reuse_watchers", "kv_event_queue"):
        assert not hasattr(pool, name), name
    for name in ("prev_free_block", "next_free_block"):
        assert not hasattr(pool.blocks[1], name), name
    assert not hasattr(pool.free_block_queue, "fake_free_list_head")


# ------------------------------------------- issue 26: bugs where features meet, on a third pool

mypool_interactions = _load("mypool_interactions")


@pytest.mark.parametrize("bug", ["PromotionKeepsPartialKeys", "EvictionAnnouncesPrimaryOnly"])
def test_both_phases_find_the_interaction_bugs_with_short_traces(bug: str) -> None:
    """Once found by the campaign alone (the machine missed them in thousands of examples) and
    reported as the last 12 of some 1,800 calls: now each phase finds them at its defaults, the
    campaign's run shrunk to a few calls, the machine's to a few steps."""
    from kvpool.oracle.core.adapter import adapter_for_class
    from kvpool.oracle.search.conform import Options, run_campaign_phase, run_machine_phase

    adapter = adapter_for_class(getattr(mypool_interactions, bug), strict_messages=False)
    campaign = run_campaign_phase(adapter, Options())
    assert not campaign.ok and campaign.failure is not None
    shrunk = campaign.failure.shrunk_from
    assert shrunk is not None and shrunk > len(campaign.failure.trace)
    assert 1 <= len(campaign.failure.trace) <= 15, campaign.failure.trace
    machine = run_machine_phase(adapter, Options())
    assert not machine.ok and machine.failure is not None
    assert 2 <= len(machine.failure.trace) <= 15, machine.failure.trace

"""kvpool inside vLLM: the plugin, and every member of a pool that vLLM's own code reaches.

The scan reads the installed vLLM's source; the plugin tests start vLLM's own plugin
loader in an interpreter that has imported vLLM, forked once per configuration.  Both skip
when vLLM is not installed; ``.ci/run`` runs them in its vLLM venv.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool.impl import (
    BlockPool,
    CachingDisabledError,
    InvalidArgumentError,
    NullBlockError,
    Request,
    UnknownBlockError,
    get_request_block_hasher,
)
from kvpool.model import ACTIONS, QUERIES

_SPEC = importlib.util.find_spec("vllm")
needs_vllm = pytest.mark.skipif(_SPEC is None, reason="vLLM is not installed (.ci/run installs it)")

# Every member of a block pool that vLLM's own code reaches, and what keeps it right.
# A member that changes the pool is a model action; one that reads it, a model query
# or a part of the observation the oracle compares after every call.
REACHED: dict[str, str] = {
    **{name: f"model action {name}" for name in (
        "get_new_blocks", "free_blocks", "touch", "unpin_blocks", "evict_blocks",
        "reset_prefix_cache", "cache_full_blocks", "cache_partial_block", "move_block_hashes",
        "emit_cached_block_events", "take_events")},
    **{name: f"model query {name}" for name in (
        "get_cached_block", "is_block_writable", "get_num_free_blocks", "get_usage")},
    # Model actions under the pool's own (private) names; the lockstep runs them:
    "_maybe_evict_cached_block": "model action _maybe_evict_cached_block (evict_blocks of one)",
    "_insert_block_hash": "model action _insert_block_hash (a copied key, its prefix as ghost)",
    "blocks": "observed: every block's id, count and hash",
    "null_block": "observed: block 0, the null block",
    "hash_block_size": "configuration",
    "num_gpu_blocks": "configuration",
    "cached_block_hash_to_block": "observed: the index (vLLM reads it with get_one_block)",
    "cached_block_hashes_by_block": "observed: secondary keys (vLLM reads them with get)",
    "kv_event_queue": "observed: pending events (vLLM's offload manager appends its own)",
    "free_block_queue": "observed: the free queue (vLLM's offload manager walks it, read only)",
}
# Members of those members that vLLM reaches (``pool.a.b``).
REACHED_DEEP = {
    ("cached_block_hash_to_block", "get_one_block"),
    ("cached_block_hashes_by_block", "get"),
    ("kv_event_queue", "append"),
    ("free_block_queue", "iter_blocks_after"),
}

_REF = re.compile(r"\b(?P<var>\w*block_pool|gpu_pool|cpu_pool|pool)\.(?P<a>\w+)(?:\.(?P<b>\w+))?")
_QUEUE = re.compile(r"\b(?:free_block_queue|free_queue)\.(?P<b>\w+)")
_NOT_A_POOL = {"cached_block_pool"}  # mooncake's ExternalCachedBlockPool, its own class
_POOL_MODULES = ("core.", "hisparse.", "v1.")  # ``vllm.v1.core.block_pool.BlockPool``: a module path


def scan(root: Path) -> tuple[dict[str, list[str]], dict[tuple[str, str], list[str]]]:
    """Members of a block pool reached in vLLM's source: ``{name: [file:line, ...]}``.

    Reads ``block_pool.x``, ``self.block_pool.x``, ``cpu_block_pool.x``,
    ``gpu_pool.x`` and the like, and ``pool.x`` in files that name ``BlockPool``;
    the pool's own module is left out.  Also ``pool.a.b`` as ``(a, b)``.
    """
    found: dict[str, list[str]] = {}
    deep: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel == "vllm/v1/core/block_pool.py":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        names_pool = "BlockPool" in text
        for lineno, line in enumerate(text.splitlines(), 1):
            if ("pool." not in line and "queue." not in line) or line.lstrip().startswith(
                    ("#", "from ", "import ")):
                continue
            for m in _REF.finditer(line):
                var, a, b = m["var"], m["a"], m["b"]
                if var in _NOT_A_POOL or (var == "pool" and not names_pool):
                    continue
                if line[: m.start()].endswith(_POOL_MODULES) or a == "py":
                    continue
                found.setdefault(a, []).append(f"{rel}:{lineno}")
                if b:
                    deep.setdefault((a, b), []).append(f"{rel}:{lineno}")
            for m in _QUEUE.finditer(line if names_pool else ""):
                deep.setdefault(("free_block_queue", m["b"]), []).append(f"{rel}:{lineno}")
    return found, deep


@needs_vllm
def test_every_member_vllm_reaches_is_known_and_kvpool_has_it() -> None:
    assert _SPEC is not None and _SPEC.origin
    found, deep = scan(Path(_SPEC.origin).parent)
    new = {name: where[:3] for name, where in found.items() if name not in REACHED}
    assert not new, f"vLLM reaches pool members this test does not know (add each to REACHED): {new}"
    new_deep = {pair: where[:3] for pair, where in deep.items()
                if pair not in REACHED_DEEP and pair[0] in REACHED and not callable(
                    getattr(BlockPool(4, True, 1), pair[0], None))}
    assert not new_deep, f"vLLM reaches members of pool members this test does not know: {new_deep}"
    assert {"_maybe_evict_cached_block", "_insert_block_hash", "touch"} <= set(found)


def test_kvpool_has_every_member_vllm_reaches() -> None:
    pool = BlockPool(4, True, 1, enable_kv_cache_events=True)
    for name, why in REACHED.items():
        assert hasattr(pool, name), name
        if why.startswith("model action "):
            assert why.removeprefix("model action ").split()[0] == name and name in ACTIONS, name
            assert callable(getattr(pool, name))
        elif why.startswith("model query "):
            assert why.removeprefix("model query ").split()[0] == name and name in QUERIES, name
    for a, b in REACHED_DEEP:
        assert hasattr(getattr(pool, a), b), (a, b)


def test_the_scan_finds_what_it_should(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm"
    (pkg / "v1" / "core").mkdir(parents=True)
    (pkg / "v1" / "core" / "block_pool.py").write_text("self.block_pool.inside_the_pool()\n")
    (pkg / "a.py").write_text(
        "from vllm.v1.core.block_pool import BlockPool\n"
        "x = self.block_pool._maybe_evict_cached_block(b)\n"
        "y = cpu_block_pool.cached_block_hash_to_block.get_one_block(h)\n"
        "pool.touch([pool.blocks[0]])\n"
        "q = free_queue.iter_blocks_after(None)\n"
        "z = cached_block_pool.contains(1)\n"
        "t = vllm.v1.core.block_pool.BlockPool\n")
    (pkg / "b.py").write_text("pool.metadata  # not a block pool: the file never names one\n")
    found, deep = scan(pkg)
    assert set(found) == {"_maybe_evict_cached_block", "cached_block_hash_to_block", "touch", "blocks"}
    assert set(deep) == {("cached_block_hash_to_block", "get_one_block"),
                         ("free_block_queue", "iter_blocks_after")}


# --------------------------------------------------------------------------
# The two private members vLLM reaches.


class _Told:
    def __init__(self) -> None:
        self.log: list[tuple[str, int | None]] = []

    def on_block_allocated(self, block: object) -> None:
        self.log.append(("allocated", getattr(block, "block_id", None)))

    def on_block_accessed(self, block: object) -> None:
        self.log.append(("accessed", getattr(block, "block_id", None)))

    def on_block_evicted(self, block: object) -> None:
        self.log.append(("evicted", getattr(block, "block_id", None)))

    def reset(self) -> None:
        self.log.append(("reset", None))


def _cached_pool(told: _Told) -> tuple[BlockPool, Request]:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True, metrics_collector=told)
    req = Request("r", list(range(8)), block_hasher=get_request_block_hasher(2))
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    pool.cache_partial_block(req, blocks[0], 2, 1, 4)
    pool.free_blocks(blocks[::-1][:2])
    return pool, req


def _state(pool: BlockPool) -> object:
    return ([(b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in pool.blocks],
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            sorted(pool.cached_block_hash_to_block.keys()),
            {k: list(v) for k, v in pool.cached_block_hashes_by_block.items()},
            [repr(e) for e in pool.kv_event_queue])


@pytest.mark.parametrize("block_id", [0, 1, 2, 3, 5])
def test_maybe_evict_is_evict_blocks_of_one_block(block_id: int) -> None:
    """Same state, events and metrics as ``evict_blocks([id])``: the model's action covers it."""
    told_a, told_b = _Told(), _Told()
    (a, _), (b, _) = _cached_pool(told_a), _cached_pool(told_b)
    had = a.blocks[block_id].block_hash is not None
    assert a._maybe_evict_cached_block(a.blocks[block_id]) is had
    b.evict_blocks([block_id])
    assert _state(a) == _state(b) and told_a.log == told_b.log


def test_maybe_evict_refuses_a_block_of_no_pool_and_changes_nothing() -> None:
    pool, _ = _cached_pool(_Told())
    before = _state(pool)
    with pytest.raises(UnknownBlockError):
        pool._maybe_evict_cached_block(BlockPool(3, True, 2).blocks[1])
    assert _state(pool) == before


def test_insert_block_hash_indexes_as_vllm_does_without_events() -> None:
    """As vLLM's CPU offload pool receives a GPU block's keys: primary first, then secondaries."""
    gpu, _ = _cached_pool(_Told())
    cpu = BlockPool(4, True, 2, enable_kv_cache_events=True)
    src = gpu.blocks[1]
    dst = cpu.get_new_blocks(1)[0]
    assert src.block_hash is not None
    cpu._insert_block_hash(src.block_hash, dst, num_tokens=src.block_hash_num_tokens)
    for key in gpu.cached_block_hashes_by_block.get(src.block_id, ()):
        cpu._insert_block_hash(key, dst, num_tokens=None)
    cpu._insert_block_hash(src.block_hash, dst, num_tokens=None)  # already there: nothing
    assert dst.block_hash == src.block_hash and dst.block_hash_num_tokens == src.block_hash_num_tokens
    assert list(cpu.cached_block_hashes_by_block.get(dst.block_id, ())) == list(
        gpu.cached_block_hashes_by_block.get(src.block_id, ()))
    assert cpu.cached_block_hash_to_block.get_one_block(src.block_hash) is dst
    assert cpu.take_events() == []
    cpu.free_blocks([dst])
    assert cpu.free_block_queue.get_all_free_blocks()[-1] is dst  # hashed: evicted last


@pytest.mark.parametrize("case", ["foreign", "key", "null", "tokens", "caching"])
def test_insert_block_hash_refuses_misuse_and_changes_nothing(case: str) -> None:
    pool = BlockPool(4, case != "caching", 2)
    block = pool.get_new_blocks(1)[0]
    key, tokens = b"h" * 8 + (0).to_bytes(4, "big"), 2
    error: type[Exception] = InvalidArgumentError
    if case == "foreign":
        block, error = BlockPool(4, True, 2).blocks[1], UnknownBlockError
    elif case == "key":
        key = b"abc"
    elif case == "null":
        block, error = pool.null_block, NullBlockError
    elif case == "tokens":
        tokens = 3
    else:
        error = CachingDisabledError
    before = _state(pool)
    with pytest.raises(error):
        pool._insert_block_hash(key, block, num_tokens=tokens)
    assert _state(pool) == before


# --------------------------------------------------------------------------
# The plugin, loaded by vLLM's own loader in a fresh interpreter (forked per configuration).

_PROBE = r"""
import json, logging, os, sys
# Imported once (about 10 s of CPU); each configuration then loads the plugins in a child forked
# from here, as a fresh interpreter that has imported the same modules would.
import vllm
import vllm.v1.core.single_type_kv_cache_manager  # bound BlockPool before the plugins load
configs, modules = json.loads(sys.argv[1]), sys.argv[2:]


def probe(plugins, version):
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("vllm.plugins.kvpool").addHandler(Keep())
    os.environ.pop("VLLM_PLUGINS", None)
    if plugins is not None:
        os.environ["VLLM_PLUGINS"] = plugins
    if version != "-":
        vllm.__version__ = version
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    import importlib
    import kvpool.impl
    from kvpool.impl.events import EventClasses
    bound = {name: importlib.import_module(name).BlockPool is kvpool.impl.BlockPool for name in modules}
    from vllm.v1.hisparse.block_pool import SharedEventQueueBlockPool
    from vllm.distributed.kv_events import BlockStored
    # What vLLM's manager sees of a pool built through vLLM's own module after the plugins loaded.
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.utils.hashing import sha256
    from vllm.v1.request import Request
    from vllm.sampling_params import SamplingParams
    init_none_hash(sha256)
    pool = BlockPool(8, True, 4, enable_kv_cache_events=True)
    req = Request("r", list(range(8)), SamplingParams(max_tokens=1), None, None,
                  block_hasher=get_request_block_hasher(4, sha256))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    pool._maybe_evict_cached_block(blocks[1])
    return {
        "bound": bound,
        "subclass": issubclass(SharedEventQueueBlockPool, kvpool.impl.BlockPool),
        "vllm_events": EventClasses.stored is BlockStored,
        "events": [type(e).__module__ + "." + type(e).__name__ for e in pool.take_events()],
        "pool_module": type(pool).__module__,
        "log": [r for r in records if "kvpool" in r],
    }


out = {}
for name, (plugins, version) in configs.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = json.dumps(probe(plugins, version))
        except BaseException as exc:
            result = json.dumps({"error": repr(exc)})
        with os.fdopen(write, "w") as pipe:
            pipe.write(result)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    out[name] = json.loads(text)
print(json.dumps(out))
"""

_CONFIGS = {  # name: (VLLM_PLUGINS, or None for unset; vllm.__version__ faked, or "-")
    "kvpool": ("kvpool", "-"),
    "every plugin": (None, "-"),
    "another plugin": ("some_other_plugin", "-"),
    "vllm 0.33.0": ("kvpool", "0.33.0"),
}


def _modules_binding_the_pool() -> list[str]:
    assert _SPEC is not None and _SPEC.origin
    root = Path(_SPEC.origin).parent
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if line.startswith("from vllm.v1.core.block_pool import") and "BlockPool" in line:
                out.append(".".join(path.relative_to(root.parent).with_suffix("").parts))
    return out


@functools.cache
def _probes() -> dict[str, dict[str, Any]]:
    """Each configuration's probe, in one interpreter that imports vLLM once (per test worker)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    done = subprocess.run([sys.executable, "-P", "-W", "ignore", "-c", _PROBE, json.dumps(_CONFIGS),
                           *_modules_binding_the_pool()],
                          env=env, capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [r for r in result.values() if "error" in r], result
    return result


def test_the_entry_point_is_registered() -> None:
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [p.value for p in points if p.name == "kvpool"] == ["kvpool.vllm_plugin:register"]


@needs_vllm
@pytest.mark.parametrize("config", ["kvpool", "every plugin"])
def test_vllm_loads_kvpool_everywhere_it_bound_its_pool(config: str) -> None:
    """Named in VLLM_PLUGINS, or with every plugin allowed (VLLM_PLUGINS unset)."""
    modules = _modules_binding_the_pool()
    assert "vllm.v1.core.kv_cache_coordinator" in modules
    got = _probes()[config]
    assert got["bound"] == dict.fromkeys(modules, True)
    assert got["subclass"] is True
    assert got["vllm_events"] is True


@needs_vllm
def test_the_plugin_is_off_when_not_selected() -> None:
    got = _probes()["another plugin"]
    assert got["bound"] == dict.fromkeys(_modules_binding_the_pool(), False)
    assert got["vllm_events"] is False and got["log"] == []
    assert got["pool_module"] == "vllm.v1.core.block_pool"


@needs_vllm
def test_the_plugin_refuses_a_vllm_whose_pool_api_it_does_not_follow() -> None:
    got = _probes()["vllm 0.33.0"]
    assert got["bound"] == dict.fromkeys(_modules_binding_the_pool(), False)
    assert got["vllm_events"] is False
    log = got["log"]
    assert isinstance(log, list) and len(log) == 1
    assert "not loaded" in log[0] and "0.33.0" in log[0] and "0.31.x" in log[0]


@needs_vllm
def test_vllms_manager_recognises_kvpools_events_through_the_plugin() -> None:
    """Without vLLM's event classes the manager leaves ``kv_cache_spec_kind`` unset."""
    got = _probes()["kvpool"]
    assert got["events"] == ["vllm.distributed.kv_events.BlockStored",
                             "vllm.distributed.kv_events.BlockRemoved"]
    assert got["pool_module"] == "kvpool.impl.pool"

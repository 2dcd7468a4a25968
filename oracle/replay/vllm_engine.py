"""vLLM's own scheduler stack with no model (``--engine vllm``): its pool bare, shadowed or replaced.

vLLM's ``Scheduler`` (with its ``KVCacheManager``, coordinator and
``BlockPool``) runs on CPU as vLLM's own scheduler tests drive it: each step
``schedule()``, then ``update_from_output()`` with a runner output made up
here (one token for every request whose tokens are all computed: its prompt
chunk done, or decoding).  The model configuration is an architecture-only
``config.json`` in a temporary folder: nothing is downloaded, no weights exist.
The pool is vLLM's own, shadowed by the model (``shadow``, the default),
kvpool's in its place (``replace``), both (``replace,shadow``) or vLLM's bare
(``none``): put in place by the caller's ``install`` (the face passes
``kvpool.vllm_plugin.use``: the oracle does not import the face).

vLLM is imported only when this loop runs (it is not a dependency of kvpool).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import import_module
from pathlib import Path
from typing import Any

from ..shadow import finish as finish_shadows
from ..shadow import shadow_of, sync
from ..trace.write import event_to_json
from .kvpool_engine import OUTPUT_BASE
from .requests import TraceRequest
from .routers import RouterWatch
from .run import Arrivals, Replay, RequestRecord, Settings

PLUGIN_MODES = ("shadow", "replace", "replace,shadow", "none")
"""What ``--plugin`` (or ``KVPOOL_PLUGIN``) may say for the replay: ``none`` is vLLM's pool bare."""

ARCHITECTURE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
    "vocab_size": 32000, "max_position_embeddings": 1 << 24, "torch_dtype": "float16",
}
"""The model vLLM is configured for: its architecture only (the scheduler never runs it)."""


class _Evictions:
    """Counts the cached blocks the pool hands out (evicted from the prefix cache), by looking at
    the head of its free queue before each ``get_new_blocks`` (any pool with vLLM's queue)."""

    def __init__(self, pool: Any) -> None:
        self.evicted = 0
        self.queue = pool.free_block_queue
        self.allocate = pool.get_new_blocks
        try:
            pool.get_new_blocks = self
        except AttributeError:  # a compiled pool takes no attribute of ours: not counted
            self.evicted = -1

    def __call__(self, num_blocks: int) -> Any:
        node, tail, hashed = self.queue.fake_free_list_head.next_free_block, self.queue.fake_free_list_tail, 0
        for _ in range(num_blocks):
            if node is None or node is tail:
                break
            hashed += node.block_hash is not None
            node = node.next_free_block
        got = self.allocate(num_blocks)
        if self.evicted >= 0:
            self.evicted += hashed
        return got


class _Publisher:
    """Where the scheduler publishes each step's KV events: to the router profiles."""

    def __init__(self, routers: RouterWatch | None, replay: Replay) -> None:
        self.routers, self.replay = routers, replay

    def publish(self, batch: Any) -> None:
        if self.routers is not None:
            self.routers.feed([event_to_json(e) for e in batch.events], self.replay.steps)

    def shutdown(self) -> None:
        pass

    def get_publisher_config(self) -> None:
        return None


Install = Callable[[str, "dict[str, Any] | None"], None]
"""Puts the pool a mode names in place in vLLM (``kvpool.vllm_plugin.use``; ``none``: vLLM's own)."""


class NoDevice(RuntimeError):
    """vLLM, imported before the loop ran without ``VLLM_TARGET_DEVICE``, found no platform."""


def _cpu_platform() -> None:
    """vLLM infers a CPU build from its version string only, once, when it is imported: this loop
    runs no model, so ``VLLM_TARGET_DEVICE=cpu`` unless the caller chose, set before that import."""
    if "vllm" not in sys.modules:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        return
    platform = type(import_module("vllm.platforms").current_platform).__name__
    if platform == "UnspecifiedPlatform":
        raise NoDevice("vLLM was imported before --engine vllm could choose its CPU platform and "
                               "found no device: set VLLM_TARGET_DEVICE=cpu in the environment")


def scheduler(settings: Settings, model_dir: Path) -> Any:
    """vLLM's ``Scheduler`` for one KV-cache group of full attention, with prefix caching."""
    torch, config = import_module("torch"), import_module("vllm.config")
    kv = import_module("vllm.v1.kv_cache_interface")
    s = settings
    max_len = s.num_blocks * s.block_size
    model = config.ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16", seed=0,
                               max_model_len=max_len)
    sched = config.SchedulerConfig(max_num_seqs=s.max_seqs, max_num_batched_tokens=s.token_budget,
                                   max_model_len=max_len, enable_chunked_prefill=True,
                                   is_encoder_decoder=False, watermark=0.0)
    cache = config.CacheConfig(block_size=s.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=True)
    events = config.KVEventsConfig(enable_kv_cache_events=True, publisher="null") if s.events else None
    vllm_config = config.VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache,
                                    parallel_config=config.ParallelConfig(), kv_events_config=events)
    spec = kv.FullAttentionSpec(block_size=s.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = kv.KVCacheConfig(num_blocks=s.num_blocks, kv_cache_tensors=[],
                                 kv_cache_groups=[kv.KVCacheGroupSpec(["layer"], spec)])
    cache.num_gpu_blocks = s.num_blocks
    import_module("vllm.v1.core.single_type_kv_cache_manager").register_all_kvcache_specs(vllm_config)
    return import_module("vllm.v1.core.sched.scheduler").Scheduler(
        vllm_config=vllm_config, kv_cache_config=kv_config, block_size=s.block_size, log_stats=False,
        structured_output_manager=import_module("vllm.v1.structured_output").StructuredOutputManager(vllm_config))


def run_vllm(requests: Iterator[TraceRequest], settings: Settings, install: Install, *,
             mode: str = "shadow", routers: list[str] | None = None, trace: str | Path | None = None,
             keep_requests: bool = False) -> Replay:
    """Replay ``requests`` through vLLM's scheduler, its pool as ``mode`` says (:data:`PLUGIN_MODES`),
    put in place by ``install``."""
    if mode not in PLUGIN_MODES:
        raise ValueError(f"plugin mode {mode!r}: expected one of {', '.join(PLUGIN_MODES)}")
    if trace is not None and "shadow" not in mode:
        raise ValueError("--trace with --engine vllm records through the shadow: use a mode with shadow")
    _cpu_platform()
    SamplingParams = import_module("vllm.sampling_params").SamplingParams
    get_hash_fn_by_name = import_module("vllm.utils.hashing").get_hash_fn_by_name
    kv_utils = import_module("vllm.v1.core.kv_cache_utils")
    ModelRunnerOutput = import_module("vllm.v1.outputs").ModelRunnerOutput
    Request = import_module("vllm.v1.request").Request

    settings = replace(settings, events=settings.events or bool(routers))
    work = Path(tempfile.mkdtemp(prefix="kvpool-replay-"))
    try:
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text(json.dumps(ARCHITECTURE), encoding="utf-8")
        install(mode, {"directory": work, "name": "replay", "keep": True} if trace is not None else None)
        engine = scheduler(settings, work / "model")
        pool = engine.kv_cache_manager.block_pool
        pool_class = getattr(type(pool), "_kvpool_shadowed_base", type(pool))
        name = "vllm" if mode == "none" else mode
        replay = Replay("vllm", f"{pool_class.__module__}:{pool_class.__qualname__} ({name})", settings,
                        records=[] if keep_requests else None)
        watch = RouterWatch(routers, settings.block_size, replay) if routers else None
        engine.kv_event_publisher = _Publisher(watch, replay)
        counter = _Evictions(pool)
        hash_fn = get_hash_fn_by_name(engine.cache_config.prefix_caching_hash_algo)
        kv_utils.init_none_hash(hash_fn)
        hasher = kv_utils.get_request_block_hasher(settings.block_size, hash_fn)
        shadow = shadow_of(pool)
        before = sync() if shadow is not None else {}
        records: dict[str, RequestRecord] = {}
        clock = 0.0
        arrivals = Arrivals(requests, settings.max_waiting)
        started, wall = time.process_time(), time.perf_counter()
        bs = settings.block_size
        while not arrivals.done or engine.has_requests():
            if not engine.has_requests() and arrivals.next is not None:
                clock = max(clock, arrivals.next.arrival_ms)
            for tr in arrivals.due(clock, len(engine.waiting)):
                if not replay.fits(tr):
                    continue
                rid = f"r{tr.index}"
                params = SamplingParams(max_tokens=tr.output_length, ignore_eos=True)
                lora = None if tr.lora is None else import_module("vllm.lora.request").LoRARequest(
                    tr.lora, 1 + abs(hash(tr.lora)) % (1 << 30), tr.lora)
                engine.add_request(Request(rid, tr.prompt, params, None, arrival_time=tr.arrival_ms / 1000,
                                           block_hasher=hasher, lora_request=lora,
                                           cache_salt=tr.cache_salt))
                records[rid] = RequestRecord(tr.index, len(tr.prompt))
            out = engine.schedule()
            for rid in out.preempted_req_ids or ():
                records[rid].preemptions += 1
                replay.preemptions += 1
            for new in out.scheduled_new_reqs:
                record = records[new.req_id]
                if record.hit_tokens < 0:
                    record.hit_tokens = new.num_computed_tokens
                    if watch is not None:
                        req = engine.requests[new.req_id]
                        watch.admitted(req, new.num_computed_tokens // bs, (req.num_tokens - 1) // bs,
                                       replay.steps)
            ids = list(out.num_scheduled_tokens)
            sampled: list[list[int]] = []
            for rid in ids:
                records[rid].steps += 1
                req = engine.requests[rid]
                done = req.num_computed_tokens >= req.num_tokens
                sampled.append([OUTPUT_BASE * (records[rid].index + 1) + req.num_output_tokens + 1] if done
                               else [])
            result = engine.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
            for outputs in result.values():
                for o in outputs.outputs:
                    if o.finish_reason is not None:
                        record = records.pop(o.request_id)
                        record.finished_step = replay.steps
                        replay.finished(record)
            replay.steps += 1
            replay.generated_tokens += sum(1 for s in sampled if s)
            clock += max(settings.step_ms, 1000.0 * out.total_num_scheduled_tokens / settings.tokens_per_s)
            replay.clock_ms = clock
            if replay.steps % 16 == 0:
                replay.sample(pool.free_block_queue.num_free_blocks)
        replay.cpu_s = time.process_time() - started
        replay.evictions = counter.evicted
        if shadow is not None:
            if trace is not None:
                shadow.finish(keep=True)
            after = sync()
            replay.calls = int(after.get("calls", 0)) - int(before.get("calls", 0))
            replay.divergences = int(after.get("divergences", 0)) - int(before.get("divergences", 0))
            replay.divergences += int(after.get("contracts", 0)) - int(before.get("contracts", 0))
            replay.checker_cpu_s = float(after.get("cpu", 0.0)) - float(before.get("cpu", 0.0))
            replay.findings += [f"{f['kind']} at call {f['call']}: {f['first']} ({f['trace']})"
                                for f in after.get("findings", [])[len(before.get("findings", [])):]]
            if "dead" in after:  # its calls went unchecked: 0 divergences would mislead
                replay.findings.append(f"the shadow's checker stopped: {after['dead']}; "
                                       "the calls counted are those checked before")
            if trace is not None:
                kept = work / "replay.jsonl"
                if not kept.exists():
                    finish_shadows()  # a checker on this thread writes it when the pool goes
                if kept.exists():
                    shutil.move(str(kept), str(trace))
                    replay.trace = str(trace)
        replay.wall_s = time.perf_counter() - wall
        return replay
    finally:
        install("none", None)
        shutil.rmtree(work, ignore_errors=True)


def environment_mode() -> str:
    """The pool mode ``KVPOOL_PLUGIN`` names for a replay (``shadow`` when unset)."""
    raw = os.environ.get("KVPOOL_PLUGIN", "").strip()
    return ",".join(m.strip() for m in raw.split(",") if m.strip()) or "shadow"


__all__ = ["ARCHITECTURE", "PLUGIN_MODES", "Install", "NoDevice", "environment_mode", "run_vllm", "scheduler"]

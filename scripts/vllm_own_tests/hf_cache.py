"""An offline Hugging Face cache holding only the architecture (``config.json``) of the models vLLM's
own scheduler tests configure, so that those tests run on a machine that cannot reach the hub.

    python hf_cache.py CACHE_DIR

vLLM's tests build a ``ModelConfig`` for a named model (``facebook/opt-125m``
by default in ``tests/v1/core/utils.py``); with ``HF_HUB_OFFLINE=1`` and
``HF_HUB_CACHE=CACHE_DIR`` it is read from here.  No weights, no tokenizer:
the scheduler never runs the model.  Each configuration is the model's
architecture as its public model card states it, written out here (nothing
is downloaded).  The multimodal models some tests name (LLaVA, Qwen2.5-VL)
need more than a configuration (a processor, ``mistral_common``): left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REVISION = "0" * 40
"""The snapshot every model is filed under (the cache's ``refs/main`` names it)."""

CONFIGS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "ffn_dim": 3072,
        "num_attention_heads": 12, "num_hidden_layers": 12, "word_embed_proj_dim": 768,
        "max_position_embeddings": 2048, "vocab_size": 50272, "do_layer_norm_before": True,
        "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "float16"},
    "facebook/opt-350m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096,
        "num_attention_heads": 16, "num_hidden_layers": 24, "word_embed_proj_dim": 512,
        "max_position_embeddings": 2048, "vocab_size": 50272, "do_layer_norm_before": False,
        "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "float16"},
    "Qwen/Qwen1.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 4096,
        "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
        "num_hidden_layers": 32, "vocab_size": 151936, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "sliding_window": 32768, "use_sliding_window": False,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 28, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "use_sliding_window": False, "max_window_layers": 28, "torch_dtype": "bfloat16"},
}


def write(cache: Path) -> list[str]:
    """The cache's files for every model in :data:`CONFIGS`; the models written."""
    for name, config in CONFIGS.items():
        repo = cache / f"models--{name.replace('/', '--')}"
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION, encoding="utf-8")
    return list(CONFIGS)


if __name__ == "__main__":
    print(f"{len(write(Path(sys.argv[1])))} model configurations in {sys.argv[1]}")

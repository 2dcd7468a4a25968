"""An offline Hugging Face cache holding only the architecture (``config.json``) of the models vLLM's
own scheduler tests configure, so that those tests run on a machine that cannot reach the hub.

    python hf_cache.py CACHE_DIR

vLLM's tests build a ``ModelConfig`` for a named model (``facebook/opt-125m``
by default in ``tests/v1/core/utils.py``); with ``HF_HUB_OFFLINE=1`` and
``HF_HUB_CACHE=CACHE_DIR`` it is read from here.  No weights, no tokenizer:
the scheduler never runs the model.  Each configuration is the model's
architecture as its public model card states it, written out in ``hf_configs.json`` (nothing
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

CONFIGS: dict[str, dict[str, Any]] = json.loads(
    Path(__file__).with_name("hf_configs.json").read_text(encoding="utf-8"))
"""Each model's ``config.json``, by name (``hf_configs.json`` beside this file)."""


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

"""What the workload's requests read: documents whose prefixes they share, and extra keys.

Lookups hit only when requests share prefixes, so each prompt is a prefix of
one of a run's few documents with a short tail of its own; LoRA, a cache
salt, a session and multimodal items (short, adjacent, several in one chunk)
now and then key the same tokens apart.  Drawn here, apart from the
engine-like steps of :mod:`.workload`, which decide what happens to a request
once it exists; every draw takes the run's ``rng``, so a seed fixes them all.
"""

from __future__ import annotations

import random
from typing import Any

from kvpool.impl.request import BlockHasher, LoRARequest, MultiModalFeature, PlaceholderRange, Request


def draw_documents(rng: random.Random) -> list[list[int]]:
    """A run's three documents of 48 tokens: every prompt reads a prefix of one."""
    return [[rng.randrange(50) for _ in range(48)] for _ in range(3)]


def random_request(rng: random.Random, documents: list[list[int]], hasher: BlockHasher, request_id: str,
                   extra_keys: bool, lacks: frozenset[str] = frozenset()) -> Request:
    """A prefix of a document, a short tail, and (with ``extra_keys``) LoRA, salt and images now and then;
    none of the extra keys a pool lacks (``lacks``: ``lora``, ``salt``, ``session``, ``mm``), which are
    drawn all the same, so that a seed draws the same run for any pool."""
    doc = rng.choice(documents)
    tokens = doc[: rng.randint(1, 24)] + [rng.randrange(50) for _ in range(rng.choice([0, 0, 1, 3]))]
    kw: dict[str, Any] = {}
    if extra_keys:
        if rng.random() < 0.3:
            kw["lora_request"] = LoRARequest(f"lora{rng.randint(1, 2)}", 7, "/a")
        if rng.random() < 0.2:
            kw["cache_salt"] = rng.choice(["s1", "s2"])
        if rng.random() < 0.25 and len(tokens) > 1:
            kw["mm_features"] = images(rng, len(tokens))
    session = rng.choice([None, "sess"])
    for name, key in (("lora", "lora_request"), ("salt", "cache_salt"), ("mm", "mm_features")):
        if name in lacks:
            kw.pop(key, None)
    return Request(request_id, tokens, block_hasher=hasher,
                   session_id=None if "session" in lacks else session, **kw)


def images(rng: random.Random, num_tokens: int) -> list[MultiModalFeature]:
    """One to three multimodal items in the prompt, sorted by offset, never overlapping.

    One to four tokens long, often adjacent: items shorter than a hash
    chunk, several items in one chunk, and chunks that cut an item.
    """
    items: list[MultiModalFeature] = []
    at = rng.randrange(num_tokens - 1)
    for _ in range(rng.randint(1, 3)):
        size = rng.randint(1, 4)
        if at + size > num_tokens:
            break
        items.append(MultiModalFeature(f"img{rng.randint(1, 2)}", PlaceholderRange(at, size)))
        at += size + rng.choice([0, 0, 1, 3])
    return items


def plain_request(documents: list[list[int]], hasher: BlockHasher, request_id: str,
                  num_tokens: int) -> Request:
    """The first ``num_tokens`` tokens of the first document, no extra keys (none: no block hashes)."""
    return Request(request_id, documents[0][:num_tokens], block_hasher=hasher)

"""A small request type with the attributes the block pool reads.

The pool never needs this class: any object with the same attributes (a real
vLLM ``Request`` included) works.  It exists so that tests, benchmarks and the
oracle can build requests without vLLM, with block hashes filled in by the
same chained scheme vLLM uses (see :mod:`kvpool.impl.hashing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .keys import BlockHash


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """The LoRA adapter a request runs with; name and path enter block hashes."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name


@dataclass(frozen=True, slots=True)
class PlaceholderRange:
    """Where a multimodal item's placeholder tokens sit in the prompt."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """A multimodal input: its content identifier and its token span."""

    identifier: str
    mm_position: PlaceholderRange


BlockHasher = Callable[["Request"], list[BlockHash]]


@dataclass(slots=True, weakref_slot=True)
class Request:
    """The request attributes a block pool reads, and nothing else.

    ``block_hashes`` holds one chained hash per full ``hash_block_size`` chunk
    of ``all_token_ids``; with a ``block_hasher`` it is kept up to date as
    tokens are appended, as vLLM's request does.
    """

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[BlockHash] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    cache_salt: str | None = None
    session_id: str | None = None
    prompt_embeds: Any = None
    block_hasher: BlockHasher | None = None
    _prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.all_token_ids)
        self._rehash()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append generated tokens and hash any chunk they complete."""
        if isinstance(token_ids, int):
            self.all_token_ids.append(token_ids)
        else:
            self.all_token_ids.extend(token_ids)
        self._rehash()

    def _rehash(self) -> None:
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

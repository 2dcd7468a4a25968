"""What a key copied from another pool names: the request ``_insert_block_hash``'s model call reads.

vLLM's CPU offload manager hands the CPU pool only the key of a GPU block
(``_insert_block_hash(key, block, num_tokens)``); the model needs the prefix
the key names.  The shadow of the pool that cached it knows (the model's
ghost ``names``): :func:`copied_key` is a request holding that prefix, with
the key's hash as the hash of its every chunk (the model reads only the last).
"""

from __future__ import annotations

from kvpool.impl.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request
from kvpool.model.request import Prefix
from kvpool.model.state import Key

from .settings import Unmodelled


def copied_key(key: Key, prefix: Prefix, hash_block_size: int, number: int) -> Request:
    """The request a copied key stands for: the tokens and extra keys of ``prefix``."""
    tokens: list[int] = []
    lora, salt = None, None
    items: dict[tuple[str, int], int] = {}  # (identifier, offset) -> end of the last chunk it is in
    for i, (chunk, tags) in enumerate(prefix):
        start = i * hash_block_size
        tokens.extend(chunk)
        for tag in tags or ():
            if tag[0] == "lora":
                lora = LoRARequest(tag[1], 0, tag[2])
            elif tag[0] == "mm":
                items[(tag[1], start + tag[2])] = start + len(chunk)
            elif tag[0] == "cache_salt":
                salt = tag[1]
            else:
                raise Unmodelled(f"a copied key names a prefix with {tag[0]}, which a trace cannot carry")
    mm = [MultiModalFeature(ident, PlaceholderRange(offset, end - offset))
          for (ident, offset), end in sorted(items.items(), key=lambda kv: kv[0][1])]
    return Request(f"copied-key-{number}", tokens, block_hashes=[key[0]] * len(prefix),
                   lora_request=lora, mm_features=mm, cache_salt=salt)


__all__ = ["copied_key"]

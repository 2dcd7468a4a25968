"""What the pool assumes of its caller: named contracts the specification checks.

The proofs hold only for callers that keep these contracts, so the model does
not take them on faith: a call that breaks one raises :class:`ContractBroken`
(the caller is wrong, not the pool: a verdict of its own) and changes
nothing.  The one assumption the model cannot check in full is that hashes
do not collide; it checks what it can see of it (a key in use naming another
prefix).

A block is *writable* when its sole owner holds it and no hash names it
(``is_block_writable``): only then may it receive KV that does not extend
what it holds.
"""

from __future__ import annotations

from .request import Content

CONTRACTS: dict[str, str] = {
    "hashes_name_one_prefix":
        "A block hash names one token prefix: a key in use never stands for another prefix.",
    "writes_extend_unless_writable":
        "KV is written into a block by one of its holders, and only as an extension of the "
        "prefix it holds unless the block is writable.",
    "replaced_by_its_sole_owner":
        "Only a block's sole owner replaces its contents (replace_existing_hashes).",
    "moves_onto_the_callers_copy":
        "move_block_hashes moves entries onto a block the caller holds alone, into which it "
        "copied the source block.",
    "cached_once_per_call":
        "cache_full_blocks lists each block once: a block holds one position of a request.",
}
"""Every caller contract, by name, with the one line that states it."""


class ContractBroken(Exception):
    """The caller broke a contract; the specification says nothing about what the pool does."""

    def __init__(self, contract: str, message: str) -> None:
        super().__init__(f"caller broke {contract}: {message}")
        self.contract = contract


def extends(longer: Content, shorter: Content) -> bool:
    """Whether ``longer`` holds ``shorter`` as a prefix."""
    return longer[: len(shorter)] == shorter


def compatible(held: Content, written: Content) -> bool:
    """Whether one prefix extends the other (a write that keeps what the block held)."""
    return extends(held, written) or extends(written, held)

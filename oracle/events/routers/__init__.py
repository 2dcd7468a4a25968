"""KV-event routers re-read: the rules real routers index a stream by, and where their index goes wrong.

A profile (:class:`~.base.Profile`) reads one engine's KV events as one router
does and answers prefix queries; :mod:`.check` compares its answers with what
the pool serves after every call of a trace.  Profiles:

``set``, ``refcount``
    The two idealised readings of ``(hash, group_idx)`` keys (:mod:`.ideal`).
``dynamo``
    NVIDIA Dynamo's KV router (:mod:`.dynamo`).
``llm-d``, ``llm-d:2025``, ``llm-d:2026[,option=value...]``
    llm-d's KV-cache manager, by release, each difference an option (:mod:`.llmd`).

Each rule a profile applies cites the file and revision of the router's public
source it follows (``docs/routers.md`` lists them).
"""

from __future__ import annotations

from functools import partial

from .base import REACTION_KINDS, Cause, Profile, Query, Reaction, Rule
from .check import Difference, Factory, RouterCheck, RouterReport, check_trace_routers, query_of
from .dynamo import DynamoRouter
from .ideal import RefcountReader, SetReader
from .llmd import RELEASES, LlmdRouter, parse_options

PROFILES = ("set", "refcount", "dynamo", "llm-d:2025", "llm-d:2026")
"""The profile names ``--router`` accepts as they are (``llm-d`` is ``llm-d:2026``; options may follow)."""


def profile_factory(spec: str) -> tuple[str, Factory]:
    """The profile a ``--router`` value names, as (canonical name, factory of block sizes).

    Raises :class:`ValueError` with a readable message for a name it does not know.
    """
    readers: dict[str, Factory] = {"set": SetReader, "refcount": RefcountReader, "dynamo": DynamoRouter}
    if spec in readers:
        return spec, readers[spec]
    if spec == "llm-d" or spec.startswith("llm-d:"):
        text = spec.partition(":")[2] or "2026"
        return f"llm-d:{text}", partial(LlmdRouter, options=parse_options(text), name=f"llm-d:{text}")
    raise ValueError(f"unknown router {spec!r}: expected one of {', '.join(PROFILES)} "
                     "(llm-d options: llm-d:2026,clear=off,parent=restart,add=strict,groups=off,"
                     "lora=off,extra=off)")


__all__ = [
    "PROFILES", "REACTION_KINDS", "RELEASES", "Cause", "Difference", "DynamoRouter", "Factory",
    "LlmdRouter", "Profile", "Query", "Reaction", "RefcountReader", "RouterCheck", "RouterReport",
    "Rule", "SetReader", "check_trace_routers", "parse_options",
    "profile_factory", "query_of",
]

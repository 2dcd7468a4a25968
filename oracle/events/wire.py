"""vLLM's KV-event wire, decoded exactly as vLLM encodes it, without vLLM.

The wire (``oracle/WIRE_FORMAT.md``): ``[topic, seq, payload]`` messages, ``payload`` a
msgpack ``KVEventBatch`` whose events are tagged maps (older releases: tagged arrays; both
are read), with every field of vLLM 0.31 and 0.33; hashes integers or bytes, read by every
checker as their low 64 bits; a replay socket; data-parallel ranks on offset ports
(:func:`rank_endpoint`).  A field or an event type no release kvpool knows is tolerated:
the decoder learns it (reported once, through :attr:`Decoder.unknown`), and decodes such
payloads at full speed from then on.

Needs ``msgspec`` (``pip install 'kvpool[live]'``), not vLLM.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from types import GenericAlias
from typing import Any

import msgspec

from ..trace.schema import EVENT_FIELDS as TRACE_EVENT_FIELDS

Hash = int | bytes
END_SEQ = (1 << 64) - 1
"""The replay socket's end marker, ``-1`` as 8 bytes read unsigned."""

_WIRE_TYPES: dict[str, Any] = {
    "hashes": list[Hash], "ehash?": Hash | None, "ints": list[int], "int": int, "int?": int | None,
    "str?": str | None, "any": list[Any] | None}
"""The type msgspec checks for each kind of event field the trace format names (:mod:`..trace.schema`)."""
LOOKAHEAD = ("lookahead_token_ids", list[list[int]] | None, False)
"""vLLM 0.33's one field more on ``BlockStored``, after 0.31's."""

EVENT_FIELDS: dict[str, list[tuple[str, Any, bool]]] = {
    kind: [(name, _WIRE_TYPES[k], required) for name, (k, required) in fields.items()]
    + ([LOOKAHEAD] if kind == "BlockStored" else [])
    for kind, fields in TRACE_EVENT_FIELDS.items()}
"""Each event type's fields in vLLM's class order (the trace format's, and 0.33's lookahead_token_ids),
with the type msgspec checks and whether vLLM always writes it.  The decoder lets the optional ones be
absent."""
_REQUIRED_TO_DECODE = {"block_hashes", "parent_block_hash", "token_ids", "block_size"}
"""What a store must say to be read (older releases lacked the rest)."""
_MAX_LEARNED = 64


class WireError(ValueError):
    """A message or payload that is not vLLM's KV-event wire; says why."""


@dataclass
class Batch:
    """One decoded ``KVEventBatch``: events as the checker reads them (dicts with ``"type"``)."""

    ts: float
    events: list[dict[str, Any]]
    data_parallel_rank: int | None
    skipped: int = 0
    """Events of a type no release kvpool knows (tolerated, not checked)."""


@dataclass
class _Form:
    """The decoder of one event form (maps or arrays), with the fields it learned."""

    array: bool
    extra: dict[str, list[str]] = field(default_factory=dict)
    """Per event type: fields (or, for arrays, trailing positions) learned beyond vLLM's."""
    types: list[str] = field(default_factory=list)
    """Event types learned beyond vLLM's three."""
    decoder: Any = None
    classes: dict[type, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Per struct class: its event type and the learned fields to drop from its dicts."""

    def build(self) -> None:
        events: list[Any] = []
        self.classes = {}
        for name, fields in [*EVENT_FIELDS.items(), *((t, []) for t in self.types)]:
            known = name in EVENT_FIELDS
            spec: list[Any] = [(n, t) if (required and n in _REQUIRED_TO_DECODE) else (n, t, None)
                               for n, t, required in fields]
            extra = self.extra.get(name, [])
            spec += [(n, Any, None) for n in extra]
            cls = msgspec.defstruct(f"{name}{'Array' if self.array else ''}", spec, tag=name,
                                    array_like=self.array, forbid_unknown_fields=known)
            self.classes[cls] = (name if known else "", tuple(extra))
            events.append(cls)
        events_type: Any = GenericAlias(list, (functools.reduce(operator.or_, events),))  # list[a struct]
        batch = msgspec.defstruct("KVEventBatch", [
            ("ts", float), ("events", events_type),
            ("data_parallel_rank", int | None, None), *((n, Any, None) for n in self.extra.get("", []))],
            array_like=True, forbid_unknown_fields=True)
        self.decoder = msgspec.msgpack.Decoder(batch)


class Decoder:
    """Decodes ``KVEventBatch`` payloads; learns (and keeps, in :attr:`unknown`) what it did not know."""

    def __init__(self) -> None:
        self.forms = [_Form(array=False), _Form(array=True)]
        for form in self.forms:
            form.build()
        self.form = self.forms[0]
        """The form the last payload had (a publisher keeps to one)."""
        self.unknown: list[str] = []
        """What was learned, in order, each once: ``"BlockStored.foo"``, ``"event type BlockUpdated"``."""
        self._asdict = msgspec.structs.asdict

    def decode(self, payload: bytes) -> Batch:
        """One payload's events, or :class:`WireError` naming what is wrong."""
        form = self.form
        try:
            raw = form.decoder.decode(payload)
        except msgspec.ValidationError as exc:
            form, raw = self._retry(payload, exc)
            self.form = form
        except msgspec.DecodeError as exc:
            raise WireError(f"not msgpack: {exc}") from None
        events, skipped = [], 0
        asdict, classes = self._asdict, form.classes
        for ev in raw.events:
            name, extra = classes[type(ev)]
            if not name:
                skipped += 1
                continue
            d = asdict(ev)
            for n in extra:
                del d[n]
            d["type"] = name
            events.append(d)
        return Batch(raw.ts, events, raw.data_parallel_rank, skipped)

    def _retry(self, payload: bytes, exc: msgspec.ValidationError) -> tuple[_Form, Any]:
        """The other form, or what this payload has that no known release has: learn it, decode again."""
        try:
            value = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError as err:
            raise WireError(f"not msgpack: {err}") from None
        array = (isinstance(value, list) and len(value) > 1 and isinstance(value[1], list)
                 and any(isinstance(e, list) for e in value[1]))
        form = self.forms[1] if array else self.forms[0]
        for attempt in range(2):
            try:
                return form, form.decoder.decode(payload)
            except msgspec.ValidationError as err:
                exc = err
            if attempt or not self._learn(form, value):
                break
            form.build()
        raise WireError(f"not a KVEventBatch: {exc}") from None

    def _learn(self, form: _Form, value: Any) -> bool:
        """Note the fields and types ``value`` has beyond vLLM's; False if it has none to learn."""
        if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], list):
            return False
        learned = False
        for i in range(3, len(value)):
            learned |= self._note(form, "", f"field_{i}", f"KVEventBatch position {i}")
        for ev in value[1]:
            if isinstance(ev, dict):
                kind, names = ev.get("type"), [k for k in ev if k != "type"]
            elif isinstance(ev, list) and ev:
                kind, names = ev[0], [f"field_{i}" for i in range(1, len(ev))]
            else:
                continue
            if not isinstance(kind, str):
                continue
            if kind not in EVENT_FIELDS:
                if kind not in form.types and len(form.types) < _MAX_LEARNED:
                    form.types.append(kind)
                    self.unknown.append(f"event type {kind}")
                    learned = True
                continue
            known = [n for n, _, _ in EVENT_FIELDS[kind]]
            for j, n in enumerate(names):
                if not (j < len(known) if form.array else n in known):
                    learned |= self._note(form, kind, n, f"{kind}.{n}")
        return learned

    def _note(self, form: _Form, kind: str, name: str, label: str) -> bool:
        extra = form.extra.setdefault(kind, [])
        if name in extra or sum(map(len, form.extra.values())) >= _MAX_LEARNED or not name.isidentifier():
            return False
        extra.append(name)
        if label not in self.unknown:
            self.unknown.append(label)
        return True


# ---------------------------------------------------------------------- frames and endpoints


def parse_frames(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """``[topic, seq, payload]`` -> (topic, sequence number, payload); :class:`WireError` otherwise."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise WireError(f"sequence number of {len(seq)} bytes, not 8")
    return topic, int.from_bytes(seq, "big"), payload


def rank_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint data-parallel rank ``rank`` uses: a tcp port plus the rank (port 0 stays 0), an
    inproc name with ``_dp<rank>``; as vLLM's publisher offsets its own."""
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        base, colon, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}" if colon and port.isdigit() and int(port) else endpoint
    raise ValueError(f"endpoint {endpoint!r}: data-parallel ranks need a tcp:// or inproc:// endpoint")


# ---------------------------------------------------------------------- encoding, as vLLM does


@functools.cache
def _encoder_classes(release: str) -> tuple[Any, dict[str, Any]]:
    """Structs laid out as vLLM's (of ``release``: 0.31 has no ``lookahead_token_ids``), defaults where
    vLLM has them, tagged maps with defaults left out (msgspec sizes a map's header by its fields)."""
    classes = {}
    for name, fields in EVENT_FIELDS.items():
        spec = [(n, t) if required else (n, t, None) for n, t, required in fields
                if release != "0.31" or n != LOOKAHEAD[0]]
        classes[name] = msgspec.defstruct(name, spec, tag=True, omit_defaults=True)
    batch = msgspec.defstruct("KVEventBatch", [("ts", float), ("events", list[Any]),
                                               ("data_parallel_rank", int | None, None)],
                              array_like=True, omit_defaults=True)
    return batch, classes


def encode_batch(events: list[dict[str, Any]], ts: float, data_parallel_rank: int | None = None,
                 release: str | None = None) -> bytes:
    """The payload vLLM's publisher sends for these events, byte for byte (tests compare with vLLM's):
    as ``release`` (``"0.31"`` or ``"0.33"``) lays its classes out; by default 0.33 if an event has
    ``lookahead_token_ids``, else 0.31."""
    if release is None:
        release = "0.33" if any(e.get("lookahead_token_ids") is not None for e in events) else "0.31"
    batch, classes = _encoder_classes(release)
    structs = [classes[e["type"]](**{n: e.get(n) for n, _, required in EVENT_FIELDS[e["type"]]
                                     if n in classes[e["type"]].__struct_fields__ and (required or n in e)})
               for e in events]
    return msgspec.msgpack.encode(batch(ts, structs, data_parallel_rank))


__all__ = ["END_SEQ", "EVENT_FIELDS", "Batch", "Decoder", "WireError", "encode_batch", "parse_frames",
           "rank_endpoint"]

"""atheris (libFuzzer) harnesses for the two file readers: ``kvpool check-trace`` and ``check-events``.

The property, for any bytes in the file: the reader either answers (a report,
which also formats) or raises one :class:`~kvpool.oracle.trace.TraceError`
whose message is a single line ``FILE:LINE: what`` naming a line of that file.
Anything else escaping the reader is a crash; an input that runs longer than
libFuzzer's ``-timeout`` is a hang.

Inputs start from real recorded runs (``kvpool.oracle.trace.record``, what
``kvpool record`` writes: traces with and without observations, misuse,
both references, two KV-cache groups) and event streams cut from them, and are
mutated half of the time by libFuzzer's byte mutations and half of the time by
a JSON-aware mutator here (truncation, dropped, duplicated and swapped lines,
values replaced by wrong types, 64-bit edge and huge numbers, deep nesting,
bad hex, unknown or missing fields, other operations and event types, invalid
UTF-8).

    python fuzz/fuzz_readers.py seeds DIR                # DIR/trace/*, DIR/events/*
    python fuzz/fuzz_readers.py trace [LIBFUZZER FLAGS] CORPUS...
    python fuzz/fuzz_readers.py events [LIBFUZZER FLAGS] CORPUS...
    python fuzz/fuzz_readers.py replay trace|events FILE...   # the property, without atheris

``fuzz/run.sh`` installs atheris in its own venv and runs both harnesses.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

READERS = ("trace", "events")
_SCRATCH = Path(tempfile.mkdtemp(prefix="kvpool-fuzz-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
_FILE = _SCRATCH / "input.jsonl"
atexit.register(shutil.rmtree, _SCRATCH, True)


check_trace: Any = None
check_events: Any = None
TraceError: Any = None


def load_readers(instrument: bool = False) -> None:
    """Import the readers' entry points, instrumented for coverage when running under atheris."""
    global check_trace, check_events, TraceError
    if instrument:
        import atheris  # lazy: libFuzzer's binding, installed only where the fuzzer runs

        with atheris.instrument_imports(include=["kvpool"]):
            from kvpool.oracle import trace  # here: atheris instruments this import
            from kvpool.oracle.events import check as events_check  # here: atheris instruments this import
    else:
        from kvpool.oracle import trace  # here: the same import, not instrumented
        from kvpool.oracle.events import check as events_check  # here: the same import, not instrumented
    check_trace, check_events, TraceError = trace.check_trace, events_check.check_events, trace.TraceError


def run_one(reader: str, data: bytes) -> None:
    """The property on one input; raises (a crash) when it does not hold."""
    _FILE.write_bytes(data)
    path = str(_FILE)
    try:
        report = check_trace(path) if reader == "trace" else check_events(path)
    except TraceError as exc:
        text = str(exc)
        if exc.path != path or exc.line < 1 or "\n" in text or not text.startswith(f"{path}:{exc.line}: "):
            raise AssertionError(f"unclear TraceError: {text!r} (line {exc.line})") from exc
        return
    report.format()


# ------------------------------------------------------------------ seeds


def write_seeds(out: Path) -> dict[str, int]:
    """Seed corpora from recorded runs: traces for both readers, event streams for check-events."""
    # lazy: the pool and the recorder, only to write seeds (the readers never need them)
    from kvpool.impl import BlockPool
    from kvpool.oracle.trace import Recording, record

    dirs = {r: out / r for r in READERS}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, Recording]] = []
    for seed in range(8):
        rec = record(BlockPool, seed, 30 if seed % 2 else 20, misuse=seed % 3 != 2,
                     observe=seed % 2 == 0, reference="0.33" if seed == 5 else "0.31")
        runs.append((f"seed{seed}", rec))
    for name, rec in runs:
        rec.write(dirs["trace"] / f"{name}.jsonl")
        if rec.header["enable_kv_cache_events"]:
            rec.write(dirs["events"] / f"{name}-trace.jsonl")
            events = [e for line in rec.lines for e in line["events"]]
            if events:
                (dirs["events"] / f"{name}-stream.jsonl").write_text(
                    "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    # A stream a router cannot follow: removed before stored, an unknown parent, a clear.
    stored = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": 6,
              "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU",
              "lora_name": None, "group_idx": 0}
    bad = [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}, stored,
           {"type": "AllBlocksCleared"}, {"type": "BlockRemoved", "block_hashes": ["00ff"],
                                          "medium": None, "group_idx": 1}]
    (dirs["events"] / "violations.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad))
    return {r: len(list(d.iterdir())) for r, d in dirs.items()}


# ------------------------------------------------------------------ JSON-aware mutations

_ADVERSARIAL: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1,
    10**30, -(10**30), 0.5, 1e308, -0.0, "", "0", "00", "0g", "FF", "ff" * 40, "\u0000", "\ud7ff",
    [], [[]], {}, {"": None}, [None], [True], [-1], [2**64], ["00"], "GPU", "BlockStored",
    "get_new_blocks", "ValueError", "not an identifier",
]


def _ops() -> list[str]:
    """Every operation a trace may name (as the model declares them), and one no pool has."""
    # Imported here, not at the top: under atheris, kvpool must first be imported inside
    # load_readers' instrumentation, or its coverage is not seen.
    from kvpool.model import POOL_OPERATIONS

    return [*POOL_OPERATIONS, "no_such_op"]


_TYPES = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"]
_KEYS = ["op", "args", "result", "error", "events", "fired", "observation", "type", "block_hashes",
         "parent_block_hash", "token_ids", "block_size", "kvpool_trace", "num_blocks", "reference",
         "block_sizes", "request", "block_ids", "num_blocks", "index", "free", "ref", "extra"]


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _slots(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:6]):
            out += _slots(v, (*path, i))
    return out


def _parent(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        value = value[key]
    return value


def _mutate_value(obj: Any, rng: random.Random) -> str:
    """One structural change to a parsed line; returns the new line's text."""
    slots = _slots(obj)[1:]
    deep = None
    if not slots:
        return json.dumps(rng.choice(_ADVERSARIAL))
    path = rng.choice(slots)
    parent = _parent(obj, path)
    key = path[-1]
    what = rng.randrange(9)
    if what == 0 and isinstance(parent, dict):
        del parent[key]
    elif what == 1 and isinstance(parent, dict):
        parent[rng.choice(_KEYS)] = rng.choice(_ADVERSARIAL)
    elif what == 2 and isinstance(parent, list):
        parent.insert(key, parent[key] if rng.random() < 0.5 else rng.choice(_ADVERSARIAL))
    elif what == 3 and isinstance(parent, list):
        del parent[key]
    elif what == 4:
        deep = rng.choice([10, 1000, 100_000])
        parent[key] = "\x00DEEP\x00"
    elif what == 5 and key in ("op", "type"):
        parent[key] = rng.choice(_ops() if key == "op" else _TYPES)
    elif what == 6 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
        parent[key] += rng.choice([-1, 1, 1 << 32, -(1 << 63), 1 << 64])
    elif what == 7 and isinstance(parent[key], str) and parent[key]:
        s = parent[key]
        i = rng.randrange(len(s))
        parent[key] = s[:i] + rng.choice("0fFgx \"\\") + s[i + 1:]
    else:
        parent[key] = rng.choice(_ADVERSARIAL)
    text = json.dumps(obj, separators=(",", ":"))
    if deep is not None:
        text = text.replace(json.dumps("\x00DEEP\x00"), "[" * deep + "]" * deep)
    return text


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """Half libFuzzer's own byte mutations, half line- and JSON-level ones."""
    import atheris  # lazy: libFuzzer's binding, installed only where the fuzzer runs

    rng = random.Random(seed)
    out = mutate_structure(data, rng) if rng.random() < 0.5 else None
    return bytes(atheris.Mutate(data, max_size)) if out is None else out[:max_size]


def mutate_structure(data: bytes, rng: random.Random) -> bytes | None:
    """One line- or JSON-level change; None when the line picked is not JSON."""
    lines = data.split(b"\n")
    what = rng.randrange(10)
    i = rng.randrange(len(lines))
    if what == 0:
        out = data[: rng.randrange(len(data) + 1)]
    elif what == 1 and len(lines) > 1:
        del lines[i]
        out = b"\n".join(lines)
    elif what == 2:
        lines.insert(i, lines[rng.randrange(len(lines))])
        out = b"\n".join(lines)
    elif what == 3 and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        out = b"\n".join(lines)
    elif what == 4:
        lines.insert(i, rng.choice([b"", b"   ", b"\r", b"\xef\xbb\xbf{}", b"\xff\xfe", b"NaN", b"1e999",
                                    b"{" * 3, b'{"a":1,"a":2}', b"9" * 5000]))
        out = b"\n".join(lines)
    else:
        try:
            obj = json.loads(lines[i])
        except (ValueError, RecursionError):
            return None
        lines[i] = _mutate_value(obj, rng).encode()
        out = b"\n".join(lines)
    return out


# ------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "seeds":
        counts = write_seeds(Path(argv[2]))
        print("seed inputs: " + ", ".join(f"{r} {n}" for r, n in counts.items()))
        return 0
    if len(argv) >= 3 and argv[1] == "replay" and argv[2] in READERS:
        load_readers()
        for name in argv[3:]:
            run_one(argv[2], Path(name).read_bytes())
        print(f"replayed {len(argv) - 3} input(s): the property holds")
        return 0
    if len(argv) < 2 or argv[1] not in READERS:
        print(__doc__, file=sys.stderr)
        return 2
    import atheris  # lazy: libFuzzer's binding, installed only where the fuzzer runs

    reader = argv[1]
    load_readers(instrument=True)

    def test_one_input(data: bytes) -> None:
        run_one(reader, data)

    atheris.Setup([argv[0], *argv[2:]], test_one_input, custom_mutator=mutate)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

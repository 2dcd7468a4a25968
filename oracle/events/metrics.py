"""``kvpool watch --metrics-port``: what the fleet came to, in Prometheus' text exposition format.

Read from another thread than the watcher's: every value is copied out (a
dict's copy is one step under the interpreter's lock) before it is written.
"""

from __future__ import annotations

from typing import Any

from .fleet import Fleet

_METRICS: list[tuple[str, str, str]] = [
    ("kvpool_watch_batches_total", "counter", "KVEventBatch messages delivered in sequence, per engine"),
    ("kvpool_watch_events_total", "counter", "KV events read and checked, per engine"),
    ("kvpool_watch_findings_total", "counter",
     "findings, per engine, kind (violation, warning, reaction, gap, restart, ...), rule and router profile"),
    ("kvpool_watch_gaps_total", "counter", "holes in an engine's sequence the replay socket did not fill"),
    ("kvpool_watch_lost_batches_total", "counter", "batches declared lost"),
    ("kvpool_watch_replayed_batches_total", "counter", "batches the replay socket sent that filled a hole"),
    ("kvpool_watch_duplicate_batches_total", "counter", "batches received twice, dropped"),
    ("kvpool_watch_reordered_batches_total", "counter", "batches received ahead of their turn, held"),
    ("kvpool_watch_restarts_total", "counter", "times an engine's sequence went back (a new engine)"),
    ("kvpool_watch_unjudged_total", "counter",
     "removals, parents and router reactions the watcher could not judge (after lost batches)"),
    ("kvpool_watch_lag_seconds", "gauge", "from a batch's timestamp to the end of its check, last batch"),
    ("kvpool_watch_lag_max_seconds", "gauge", "the largest lag so far"),
    ("kvpool_watch_live_keys", "gauge", "keys the engine holds by its stream (the checker's memory)"),
    ("kvpool_watch_held_batches", "gauge", "batches held for a hole in the sequence"),
]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def render(fleet: Fleet) -> str:
    """The exposition text (``GET /metrics``)."""
    rows: dict[str, list[str]] = {name: [] for name, _, _ in _METRICS}
    for engine in list(fleet.engines.values()):
        e = _labels(engine=engine.name)
        c, s = engine.counts, engine.sequencer.stats
        values: dict[str, Any] = {
            "kvpool_watch_batches_total": c.batches, "kvpool_watch_events_total": c.events,
            "kvpool_watch_gaps_total": s.gaps, "kvpool_watch_lost_batches_total": s.lost,
            "kvpool_watch_replayed_batches_total": s.recovered,
            "kvpool_watch_duplicate_batches_total": s.duplicates,
            "kvpool_watch_reordered_batches_total": s.reordered, "kvpool_watch_restarts_total": s.restarts,
            "kvpool_watch_unjudged_total": engine.reading.checker.unjudged + sum(
                r.unjudged for r in list(engine.reading.routers)),
            "kvpool_watch_lag_seconds": c.lag, "kvpool_watch_lag_max_seconds": c.lag_max,
            "kvpool_watch_live_keys": engine.reading.checker.left_stored,
            "kvpool_watch_held_batches": len(engine.sequencer.held),
        }
        for name, value in values.items():
            rows[name].append(f"{name}{e} {value}")
        for (kind, rule, profile), n in dict(c.findings).items():
            rows["kvpool_watch_findings_total"].append(
                "kvpool_watch_findings_total"
                + _labels(engine=engine.name, kind=kind, rule=rule, profile=profile) + f" {n}")
    out = [line for name, kind, text in _METRICS
           for line in (f"# HELP {name} {text}", f"# TYPE {name} {kind}", *rows[name])]
    return "\n".join(out) + "\n"


__all__ = ["render"]

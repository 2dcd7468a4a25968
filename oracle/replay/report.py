"""A replay's report (``--report DIR``): Markdown and one self-contained HTML page, with plots.

Plain data in (:meth:`~.run.Replay.to_json`), plain SVG out: the hit rate,
the free blocks and each router's over- and under-claimed tokens over the
run's simulated time.  Nothing here depends on the reviewer's report
(:mod:`kvpool.report`), so the two change apart.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, PAD = 640, 220, 44
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def line_chart(title: str, x: Sequence[float], lines: Sequence[tuple[str, Sequence[float]]],
               x_label: str, y_label: str) -> str:
    """An SVG line chart of ``lines`` (name, values) over ``x``; an empty frame without points."""
    ys = [v for _, values in lines for v in values]
    x0, x1 = (min(x), max(x)) if x else (0.0, 1.0)
    y0, y1 = (min(0.0, *ys), max(ys)) if ys else (0.0, 1.0)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def px(v: float) -> float:
        return PAD + (v - x0) / (x1 - x0) * (WIDTH - 2 * PAD)

    def py(v: float) -> float:
        return HEIGHT - PAD + (v - y0) / (y1 - y0) * (2 * PAD - HEIGHT)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
           f"<title>{html.escape(title)}</title>",
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
           f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
           f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">{html.escape(x_label)}</text>',
           f'<text x="12" y="{HEIGHT / 2}" transform="rotate(-90 12 {HEIGHT / 2})" '
           f'text-anchor="middle">{html.escape(y_label)}</text>']
    for value, anchor, (tx, ty) in ((y0, "end", (PAD - 4, py(y0) + 4)), (y1, "end", (PAD - 4, py(y1) + 4)),
                                    (x0, "start", (PAD, HEIGHT - PAD + 14)),
                                    (x1, "end", (WIDTH - PAD, HEIGHT - PAD + 14))):
        out.append(f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}">{_number(value)}</text>')
    for i, (name, values) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x, values, strict=False))
        if points:
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
        out.append(f'<text x="{WIDTH - PAD}" y="{PAD + 14 * i}" text-anchor="end" fill="{colour}">'
                   f"{html.escape(name)}</text>")
    out.append("</svg>")
    return "\n".join(out)


def _number(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.3g}"


def charts(result: dict[str, Any]) -> dict[str, str]:
    """The report's plots by file name: hit rate, free blocks, router error (if any router ran)."""
    columns, points = result["series"]["columns"], result["series"]["points"]
    col = {name: i for i, name in enumerate(columns)}
    x = [p[col["clock_s"]] for p in points]
    out = {
        "hit_rate.svg": line_chart("Prefix hit rate (prompt tokens, cumulative)", x,
                                   [("hit rate", [p[col["hit_rate"]] for p in points])],
                                   "simulated time (s)", "share of prompt tokens"),
        "free_blocks.svg": line_chart("Free blocks", x, [("free", [p[col["free_blocks"]] for p in points])],
                                      "simulated time (s)", "blocks"),
    }
    if result["routers"]:
        lines = [(f"{r['name']} {side}", [p[col[f"{r['name']} {side}_tokens"]] for p in points])
                 for r in result["routers"] for side in ("over", "under")]
        out["router_error.svg"] = line_chart("Router error: prefix tokens claimed wrongly (cumulative)", x,
                                             lines, "simulated time (s)", "tokens")
    return out


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run says, as (what, value) rows."""
    s = result["settings"]
    rows = [
        ("engine", f"{result['engine']}: {result['pool']}"),
        ("pool", f"{s['num_blocks']:,} blocks of {s['block_size']} tokens; token budget "
                 f"{s['token_budget']:,}; at most {s['max_seqs']} requests at once; "
                 f"KV events {'on' if s['events'] else 'off'}"),
        ("requests finished", f"{result['requests']:,} ({result['prompt_tokens']:,} prompt tokens, "
                              f"{result['generated_tokens']:,} generated)"),
        ("hit rate", f"{result['token_hit_rate']:.1%} of prompt tokens; {result['request_hit_rate']:.1%} of "
                     f"requests hit at least one block"),
        ("evictions", "not counted" if result["evictions"] < 0 else f"{result['evictions']:,} cached blocks"),
        ("preemptions", f"{result['preemptions']:,}"),
        ("steps", f"{result['steps']:,} ({result['simulated_s']:,.1f} s simulated)"),
        ("pool calls checked", f"{result['calls']:,} ({result['calls_per_s']:,.0f} calls/s)"),
        ("divergences", f"{result['divergences']}"),
        ("CPU", f"engine {result['cpu_s']:.1f} s, checker {result['checker_cpu_s']:.1f} s; "
                f"wall {result['wall_s']:.1f} s"),
    ]
    for r in result["routers"]:
        rows.append((f"router {r['name']}",
                     f"over-claimed {r['over_tokens']:,} tokens in {r['over_requests']:,} requests, "
                     f"under-claimed {r['under_tokens']:,} tokens in {r['under_requests']:,} requests "
                     f"(of {r['queries']:,}); {r['reactions']:,} events not indexed as meant"))
    if result["trace"]:
        rows.append(("trace", f"{result['trace']} (kvpool check-trace reads it)"))
    return rows


def markdown(result: dict[str, Any], plots: Sequence[str]) -> str:
    lines = ["# kvpool replay", "", "| what | value |", "|---|---|"]
    lines += [f"| {what} | {value.replace('|', '/')} |" for what, value in summary_rows(result)]
    if result["findings"]:
        lines += ["", "## Findings", ""] + [f"- {f}" for f in result["findings"]]
    lines += ["", "## Over the run", ""] + [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def page(result: dict[str, Any], plots: dict[str, str]) -> str:
    rows = "".join(f"<tr><th>{html.escape(w)}</th><td>{html.escape(v)}</td></tr>"
                   for w, v in summary_rows(result))
    findings = "".join(f"<li>{html.escape(f)}</li>" for f in result["findings"])
    return ("<!doctype html><html><head><meta charset='utf-8'><title>kvpool replay</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}th{text-align:left;"
            "padding-right:1em;vertical-align:top}td,th{border-bottom:1px solid #ddd;padding:.2em}</style>"
            f"</head><body><h1>kvpool replay</h1><table>{rows}</table>"
            + (f"<h2>Findings</h2><ul>{findings}</ul>" if findings else "")
            + "<h2>Over the run</h2>" + "".join(f"<div>{svg}</div>" for svg in plots.values())
            + "</body></html>\n")


def write_report(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """``replay.md``, ``replay.html``, ``replay.json`` and the plots in ``directory``; the files."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    plots = charts(result)
    files = {**{name: svg + "\n" for name, svg in plots.items()}, "replay.md": markdown(result, list(plots)),
             "replay.html": page(result, plots), "replay.json": json.dumps(result, indent=1) + "\n"}
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files]


__all__ = ["charts", "line_chart", "markdown", "page", "summary_rows", "write_report"]

"""``kvpool claims``: every property of the model and what establishes it, on one page."""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvpool.claims import claims_table, format_table, lemmas

from .usage import command_parser, fail, write_json


def main(argv: Sequence[str] | None = None) -> int:
    """Print the claims table (0), or a usage error (2)."""
    parser = command_parser(
        "kvpool claims",
        "Every invariant and step property of the model, and what establishes it:\n"
        "z3 for any pool size, bounded model checking on small pools, the lockstep\n"
        "of the pool against the model, the seeded bugs it catches, the tests.",
        "examples:\n  kvpool claims\n  kvpool claims --from verify.json --json claims.json")
    parser.add_argument("--from", dest="source", metavar="FILE",
                        help="a kvpool verify --json result: show what that run established")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    args = parser.parse_args(argv)
    doc = None
    if args.source:
        try:
            with open(args.source, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            return fail(f"kvpool claims: error: --from {args.source!r}: {exc}")
        if not isinstance(doc, dict) or doc.get("schema") != "kvpool.verify/1":
            return fail(f"kvpool claims: error: --from {args.source!r} is not a kvpool verify result")
    rows = claims_table(doc)
    print(format_table(rows), end="")
    print("lemmas of the proofs (not properties of the model): "
          + "; ".join(f"{k}: {v}" for k, v in lemmas().items()))
    if args.json:
        write_json(args.json, {"claims": rows, "lemmas": lemmas()})
    return 0

"""kvpool corpus add: the legal corpus grows from any trace, by what the trace teaches it."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

from kvpool.cli import corpus as corpus_cli
from kvpool.corpus import grow, reached
from kvpool.oracle.generate.legal import legal_traces
from kvpool.oracle.trace import check_trace

CORPUS = Path(__file__).resolve().parents[1] / "oracle" / "generate" / "corpus"
WORKLOAD = CORPUS / "workloads" / "workload_seed1.jsonl"


def test_a_trace_that_reaches_something_new_is_added_up_to_its_last_new_call(tmp_path: Path) -> None:
    out = grow([WORKLOAD], tmp_path, corpus=[])
    (g,) = out.traces
    assert out.corpus == 0 and not g.refused and 0 < g.kept < g.calls and g.new > 0
    written = Path(g.written)
    assert check_trace(written).ok  # a prefix of a legal trace is legal
    header = json.loads(written.read_text().splitlines()[0])
    assert header["meta"]["legal_prefix_of"] == {"trace": WORKLOAD.name, "calls": g.kept, "of": g.calls}
    assert sum(1 for _ in reached(written)) == g.kept
    again = grow([WORKLOAD], tmp_path / "again", corpus=[written])  # the prefix already teaches it all
    assert again.traces[0].kept == 0 and not (tmp_path / "again").exists()


def test_the_shipped_corpus_already_holds_what_the_workload_and_vllm_tests_teach(tmp_path: Path) -> None:
    vllm = sorted((CORPUS / "vllm").glob("*.jsonl"))
    workloads = sorted((CORPUS / "workloads").glob("*.jsonl"))
    shipped = {(p.parent.name, p.name) for p in legal_traces()}  # installed: another folder, same files
    assert {(p.parent.name, p.name) for p in vllm + workloads} <= shipped
    from_workloads = grow(vllm, tmp_path, corpus=workloads, dry_run=True)
    assert any(g.kept for g in from_workloads.traces)  # vLLM's own tests teach the workload something
    assert all(g.kept == 0 for g in grow(vllm + workloads, tmp_path, dry_run=True).traces)


def test_a_trace_the_model_does_not_accept_whole_is_refused_not_added(tmp_path: Path) -> None:
    lines = WORKLOAD.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"op":"get_num_free_blocks"' in line and i > 20)
    step = json.loads(lines[at])
    step["result"] += 1
    lines[at] = json.dumps(step)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    shown = io.StringIO()
    with redirect_stdout(shown):
        code = corpus_cli.main(["add", str(bad), "--into", str(tmp_path / "corpus")])
    assert code == 1 and "REFUSED" in shown.getvalue() and "get_num_free_blocks" in shown.getvalue()
    assert not (tmp_path / "corpus").exists()
    assert corpus_cli.main(["add", str(tmp_path / "missing.jsonl"), "--into", str(tmp_path)]) == 2

"""scripts/spec_mutants.py: mutants of the specification, made mechanically and judged by the formal side.

Judging the whole sample takes an hour (docs/verification.md has the measured score); here the
mutator, the sample and the judge are checked on what is cheap: the population is made from every
file of the specification, the sample is the same for the same seed, the judge passes the unmutated
specification and refutes a wrong one, and a mutant that loops forever is stopped by its step
budget and reported as a timeout, never as refuted.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import spec_mutants as SM  # noqa: E402
from spec_mutation import mutate  # noqa: E402
from spec_mutation.named import NAMED, edited  # noqa: E402

CHEAP = ("legal-corpus", "bmc/4-2-2")


@pytest.fixture(scope="module")
def population() -> dict[str, list[mutate.Mutant]]:
    return mutate.population()


def test_every_file_of_the_specification_has_mutants_of_every_kind(
        population: dict[str, list[mutate.Mutant]]) -> None:
    assert set(population) == set(mutate.FILES) and all(population.values())
    operators = {m.operator for ms in population.values() for m in ms}
    assert {"comparison", "and/or", "operand dropped", "number", "statement dropped", "raise dropped",
            "z3 operand dropped", "z3 and/or", "z3 store forgotten", "forall/exists",
            "z3 premise dropped", "value dropped"} <= operators
    again = mutate.mutants("model/guards.py")
    assert [m.id for m in again] == [m.id for m in population["model/guards.py"]]  # a fixed walk


def test_each_mutant_changes_the_code_at_its_line(population: dict[str, list[mutate.Mutant]]) -> None:
    for path in ("model/pool.py", "proofs/step_properties.py"):
        original = ast.unparse(ast.parse(mutate.source(path)))
        for m in population[path][::7]:
            assert ast.unparse(mutate.apply(m)) != original, m.describe()
    m = population["model/guards.py"][0]
    stale = mutate.Mutant(m.file, m.number, m.line, m.operator, m.before, m.after, "0" * 12)
    with pytest.raises(ValueError, match="changed since"):
        mutate.apply(stale)


def test_the_sample_is_stratified_and_the_same_for_the_same_seed(
        population: dict[str, list[mutate.Mutant]]) -> None:
    one = SM.stratified(population, 240, 38, 8)
    assert [m.id for m in one] == [m.id for m in SM.stratified(population, 240, 38, 8)]
    assert [m.id for m in one] != [m.id for m in SM.stratified(population, 240, 39, 8)]
    assert abs(len(one) - 240) <= len(mutate.FILES)
    per_file = {f: sum(m.file == f for m in one) for f in population}
    total = sum(map(len, population.values()))
    for f, n in per_file.items():
        assert n >= min(8, len(population[f]))
        assert abs(n - 240 * len(population[f]) / total) <= 8


def test_the_hand_written_wrong_specifications_still_apply() -> None:
    kinds = {n.kind for n in NAMED}
    assert kinds == {"model", "z3", "both", "contract", "domain"}
    for n in NAMED:
        texts = edited(n, mutate.ROOT)
        assert all(ast.parse(t) for t in texts.values()), n.name


def _judge(path: str, tree: ast.Module, checks: tuple[str, ...], budget: int = 10**12) -> dict[str, object]:
    return SM._judged({path: tree}, budget, None, checks)  # the installed package


def test_the_judge_passes_the_specification_and_refutes_a_wrong_one(
        population: dict[str, list[mutate.Mutant]]) -> None:
    original = _judge("model/guards.py", ast.parse(mutate.source("model/guards.py")), CHEAP)
    assert original["verdict"] == "survived", original
    steps = [c["steps"] for c in original["checks"]]  # type: ignore[union-attr]
    assert all(steps)  # the guards run in both checks
    again = _judge("model/guards.py", ast.parse(mutate.source("model/guards.py")), CHEAP)
    assert [c["steps"] for c in again["checks"]] == steps  # type: ignore[union-attr]  # work, not time
    lines = mutate.source("model/guards.py").splitlines()
    raise_dropped = next(m for m in population["model/guards.py"] if m.operator == "raise dropped"
                         and "NOT_ENOUGH_FREE_BLOCKS" in lines[m.line - 1])
    wrong = _judge(raise_dropped.file, mutate.apply(raise_dropped), CHEAP)
    assert wrong["verdict"] == "refuted", wrong
    assert wrong["kind"] in ("violation", "counterexample", "exception"), wrong


def test_a_mutant_that_loops_forever_is_a_timeout_of_its_step_budget_not_a_refutation() -> None:
    tree = ast.parse(mutate.source("model/guards.py"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "check_ids":
            node.body.insert(0, ast.While(ast.Constant(True), [ast.Pass()], []))
    out = _judge("model/guards.py", ast.fix_missing_locations(tree), CHEAP, budget=200_000)
    assert out["verdict"] == "timeout" and out["kind"] == "step budget", out


def test_the_report_counts_listed_survivors_as_equivalent_and_fails_under_its_floor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = next(iter(SM.equivalents()))
    file = listed.split("|")[0]
    rows = [{"id": f"{file}#1", "file": file, "verdict": "refuted", "cpu": 1.0},
            {"id": f"{file}#2", "file": file, "verdict": "survived", "key": listed, "cpu": 9.0},
            {"id": f"{file}#3", "file": file, "verdict": "survived", "key": f"{file}|not listed", "cpu": 9.0}]
    assert SM.score(rows) == 50.0  # 1 refuted of 2: the listed one is not scored
    table = SM.report(rows)
    assert "| 3 | 1 | 1 | 1 | 0 | 0 | 0 | 50.0 % |" in table and f"{file}#3 [survived]" in table
    out = tmp_path / "results.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert SM.main(["--report", str(out)]) == 0
    assert SM.main(["--report", str(out), "--fail-under", "50"]) == 0
    assert SM.main(["--report", str(out), "--fail-under", "90"]) == 1
    assert "below 90" in capsys.readouterr().err

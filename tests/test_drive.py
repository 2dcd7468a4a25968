"""``kvpool conform --exec``: a pool in another process, over the drive protocol.

Three pools play the process: kvpool's own (``kvpool serve-pool``), the Rust
pool in ``clients/rust-pool`` (built here with the machine's ``cargo``;
those tests are skipped, saying so, only when cargo is missing), and
``tests/drive_misbehaving.py``, which breaks the protocol in each way a
process can.  Every run is bounded by calls and examples, never by time; the
one timeout used (``--timeout 5``) is waited out by a process that never
answers, whatever the machine's load (the calls before it are answered well
within it even on a loaded machine), and a process that lingers at the end is
given 10 s before it is called lingering.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool.impl import BlockPool
from kvpool.model import ACTIONS, initial_state
from kvpool.oracle.drive import DriveAdapter, protocol
from kvpool.oracle.drive.facade import DrivenRefusal
from kvpool.oracle.drive.serve import Server
from kvpool.oracle.drive.views import shown_view
from kvpool.oracle.trace import check_trace
from kvpool.oracle.trace.check import canonical_event

ROOT = Path(__file__).resolve().parents[1]
RUST = ROOT / "clients" / "rust-pool"
MISBEHAVING = Path(__file__).parent / "drive_misbehaving.py"
SERVE = f"{shlex.quote(sys.executable)} -P -m kvpool.oracle.drive.serve"
BUGS = ("cached-to-head", "dup-listing-once", "mask-ignored", "mm-absolute-offset",
        "promote-keeps-partial", "group-blind", "reset-forgets-watchers", "null-hashed")
HUNT = ["--runs", "2", "--steps", "500", "--examples", "500", "--machine-steps", "15"]
"""The budget tests/test_conform.py hunts the catalogue's bugs with."""
SMALL = ["--runs", "1", "--steps", "150", "--examples", "30"]


def kvpool(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "kvpool", *argv], cwd=cwd, capture_output=True,
                          text=True, check=False, timeout=900)


@pytest.fixture(scope="session")
def rust_pool() -> str:
    """The Rust pool, built offline (``cargo build --release --offline``)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust reference client cannot be built")
    done = subprocess.run([cargo, "build", "--release", "--offline", "--quiet"], cwd=RUST,
                          capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr
    binary = RUST / "target" / "release" / "rust-pool"
    assert binary.is_file()
    return str(binary)


def misbehaving(mode: str, *extra: str) -> str:
    return shlex.join([sys.executable, str(MISBEHAVING), mode, *extra])


# ------------------------------------------------------------ the protocol


def _answer(value: object, op: str = "get_num_free_blocks", args: dict[str, object] | None = None,
            shape: frozenset[str] | None = None) -> object:
    header = protocol.read_pool(protocol.header(protocol.pool_fields(4, True, 1, True)))
    return protocol.read_answer(op, args or {}, value, header, 2, shape)[0]


def test_answers_are_read_as_trace_lines_and_unknown_fields_are_ignored() -> None:
    step = _answer({"result": 3, "error": None, "events": [], "seq": 7, "took_ns": 12})
    assert step.result == 3 and step.fired == []  # fired may be left out when empty
    for bad, says in [({"result": "3", "error": None, "events": []}, "result: expected an integer"),
                      ({"result": 3, "error": None}, "missing field 'events'"),
                      ({"result": 3, "error": None, "events": None}, "events: expected the list"),
                      ({"result": 3, "error": "not a name", "events": []}, "error class name"),
                      ([3], "expected an answer object"),
                      ({"result": 3, "error": None, "events": [],
                        "observation": {"ref": [0] * 4, "free": [1, 2, 3], "primary": [None] * 4,
                                        "num_free": 3}}, "the header's answer carried none")]:
        with pytest.raises(protocol.ProtocolError, match=re.escape(says)):
            _answer(bad)


def test_what_a_process_shows_when_asked_is_checked_strictly() -> None:
    """The blocks and keys an observe answer shows pass only when equal in kind too: a count of
    ``true`` for 1, an entry too many, a block id written as ``true`` each differ (an answer that
    passes is not read again)."""
    model = initial_state(4, True, 1, False)
    ACTIONS["get_new_blocks"](model, 1)
    check = shown_view(model, [1, 2], [])
    good = {"ref": [1, 0], "primary": [None, None], "secondary": [[], []], "watched": [False, False]}
    assert check(good) == []
    for name, wrong in (("ref", [True, 0]), ("ref", [1, 0, 0]), ("watched", [0, False]),
                        ("secondary", ["", []])):
        assert check({**good, name: wrong}), (name, wrong)
    key = (b"\x01" * 8, 0)
    model.index[key] = (1,)
    assert shown_view(model, [], [key])({"ref": [], "primary": [], "index": [[True]]})
    assert shown_view(model, [], [key])({"ref": [], "primary": [], "index": [[1]]}) == []


def test_header_answers_version_refusal_and_logging() -> None:
    assert protocol.read_header_answer({"ok": True, "pid": 12}).observation is None
    cases = [({"kvpool_drive": 2, "ok": True}, "version"), ({"ok": False, "error": "no"}, "refused"),
             ({"ok": "yes"}, "garbage")]
    for value, kind in cases:
        with pytest.raises(protocol.ProtocolError) as caught:
            protocol.read_header_answer(value)
        assert caught.value.kind == kind
    with pytest.raises(protocol.ProtocolError) as logged:
        protocol.decode(b"INFO pool ready\n")
    assert logged.value.kind == "stdout logging"
    with pytest.raises(protocol.ProtocolError, match="unsupported protocol version 2") as other:
        protocol.read_pool({"kvpool_drive": 2, "pool": {}})
    assert other.value.kind == "version"


def _documented_exchange(heading: str = "## A complete exchange") -> list[tuple[str, object]]:
    text = (ROOT / "oracle" / "DRIVE_PROTOCOL.md").read_text()
    block = text.split(heading, 1)[1].split("```", 2)[1]
    return [(line[0], json.loads(line[2:])) for line in block.splitlines() if line[:2] in ("> ", "< ")]


def test_the_documented_exchange(tmp_path: Path) -> None:
    """kvpool's own pool gives the documented answers to the documented lines, and the
    exchange, written as a trace, is accepted by check-trace."""
    exchange = _documented_exchange()
    server = Server(BlockPool, observe=False)
    trace: list[dict[str, object]] = []
    for (mark, sent), (back, documented) in zip(exchange[::2], exchange[1::2], strict=True):
        assert (mark, back) == (">", "<")
        got = server.answer(protocol.encode(sent))
        assert isinstance(documented, dict) and isinstance(sent, dict)
        if protocol.KEY in sent:
            assert got["ok"] is documented["ok"] is True
            trace.append(protocol.trace_header(sent["pool"]))
            continue
        assert got["error"] == documented["error"] and got["fired"] == documented.get("fired", [])
        taken = sent["op"] == "take_events"
        assert taken or got["result"] == documented["result"]
        for name in ("events", "result") if taken else ("events",):
            for mine, theirs in zip(got[name], documented[name], strict=True):
                written = canonical_event(theirs)  # the fields the documented answer writes
                assert {k: v for k, v in canonical_event(mine).items() if k in written} == written
        trace.append({**sent, **documented})
    path = tmp_path / "exchange.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in trace))
    assert check_trace(path).ok, check_trace(path).format()
    # the optional parts: answered exactly so by kvpool's pool declaring the same lacks
    server = Server(BlockPool, observe=False, lacks=["cache_partial_block", "several_groups"])
    optional = _documented_exchange("## An exchange with the optional parts")
    for (_mark, sent), (_back, documented) in zip(optional[::2], optional[1::2], strict=True):
        assert server.answer(protocol.encode(sent)) == documented


# ------------------------------------------------------------ reference clients


def test_kvpools_own_pool_conforms_over_the_pipe(tmp_path: Path) -> None:
    for extra, level in (("", "api-only"), (" --observe", "mixed")):
        done = kvpool("conform", "--exec", SERVE + extra, *SMALL, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"observed {level}" in done.stdout and "agrees with the model" in done.stdout


@pytest.mark.slow  # 50 s; the Rust pool's and kvpool's own run by default
def test_any_python_pool_served_over_the_pipe(tmp_path: Path) -> None:
    """A stranger's pool (tests/third_party: no private vLLM members, no typed refusals) behind
    ``kvpool serve-pool --pool``: it agrees, and one of its planted bugs is caught over the pipe."""
    third = Path(__file__).parent / "third_party"
    budget = ["--no-misuse", "--vllm-errors", "--runs", "2", "--steps", "300", "--examples", "40",
              "--trace-dir", str(tmp_path)]
    done = kvpool("conform", "--exec", "kvpool serve-pool --pool mypool:BlockPool", *budget, cwd=third)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = kvpool("conform", "--exec", "kvpool serve-pool --pool mypool_bugs:CachedFreedToHead", *budget,
                 cwd=third)
    assert bad.returncode == 1 and "DIVERGES from the model" in bad.stdout, bad.stdout


def test_the_rust_pool_conforms(rust_pool: str, tmp_path: Path) -> None:
    for extra, level in (("", "api-only"), (" --observe", "mixed")):
        done = kvpool("conform", "--exec", rust_pool + extra, "--runs", "2", "--steps", "500",
                      "--examples", "50", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"observed {level}" in done.stdout
        assert not list(tmp_path.glob("kvpool-drive-*.jsonl"))  # no failure, no trace


def test_kvpool_check_exec(rust_pool: str, tmp_path: Path) -> None:
    done = kvpool("check", "--exec", rust_pool, "--runs", "2", "--steps", "300", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 runs agree" in done.stdout
    bad = kvpool("check", "--exec", f"{rust_pool} --bug cached-to-head", "--runs", "2", "--steps", "300",
                 cwd=tmp_path)
    assert bad.returncode == 1 and "DIVERGED" in bad.stdout
    assert check_trace(tmp_path / "kvpool-drive-campaign.jsonl").divergence is not None


def test_the_reference_clients_ignore_unknown_fields_and_check_the_version(rust_pool: str) -> None:
    lines = [{"kvpool_drive": 2, "pool": {"num_blocks": 4}},
             {"kvpool_drive": 1, "from": "kvpool", "pool": {**protocol.pool_fields(4, True, 1, False),
                                                          "colour": "blue"}},
             {"op": "get_new_blocks", "args": {"num_blocks": 2}, "seq": 1},
             {"op": "no_such_op", "args": {}},
             {"op": "get_num_free_blocks", "args": {}}]
    calls = "".join(json.dumps(line) + "\n" for line in lines)
    for argv in ([rust_pool], [sys.executable, "-P", "-m", "kvpool.oracle.drive.serve"]):
        done = subprocess.run(argv, input=calls, capture_output=True, text=True, check=True)
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert answers[0]["ok"] is False and "version" in answers[0]["error"]
        assert answers[1]["ok"] is True
        assert answers[2]["result"] == [1, 2] and answers[2]["error"] is None
        assert answers[3]["error"] == "ProtocolViolation" and "no_such_op" in done.stderr
        assert answers[4]["result"] == 1


def _normalised(text: str) -> list[object]:
    """The answers, but a refusal's ``message``: free text, each pool its own words."""
    out = []
    for line in text.splitlines():
        answer = json.loads(line)
        answer.pop("message", None)
        out.append(answer)
    return out


def test_rust_and_kvpool_answer_line_for_line(rust_pool: str, tmp_path: Path) -> None:
    """The same calls (a recorded run's, misuse included) get the same answers from both."""
    trace = tmp_path / "run.jsonl"
    assert kvpool("record", str(trace), "--steps", "400", "--seed", "5", cwd=tmp_path).returncode == 0
    calls = kvpool("serve-pool", "--input-of", str(trace), cwd=tmp_path).stdout
    assert calls.count("\n") > 100
    for extra in ([], ["--observe"]):
        ours = subprocess.run([sys.executable, "-P", "-m", "kvpool", "serve-pool", *extra], input=calls,
                              capture_output=True, text=True, check=True).stdout
        theirs = subprocess.run([rust_pool, *extra], input=calls, capture_output=True, text=True,
                                check=True).stdout
        assert _normalised(ours) == _normalised(theirs)


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_caught_with_a_short_trace(rust_pool: str, bug: str, tmp_path: Path) -> None:
    done = kvpool("conform", "--exec", f"{rust_pool} --bug {bug}", *HUNT, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    shrunk = re.search(r"minimal trace \((\d+) steps, shrunk by Hypothesis", done.stdout)
    assert shrunk is not None and int(shrunk.group(1)) <= 15, done.stdout
    for phase in ("campaign", "machine"):  # each phase that failed, as a short trace file
        written = tmp_path / f"kvpool-drive-{phase}.jsonl"
        if phase == "campaign" and not written.exists():
            continue
        report = check_trace(written)
        assert report.divergence is not None and report.steps <= 15, done.stdout
    # The file replays in the author's own test: its calls, fed to the same pool, give its answers.
    calls = kvpool("serve-pool", "--input-of", str(written), cwd=tmp_path).stdout
    again = subprocess.run([rust_pool, "--bug", bug], input=calls, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    recorded = [json.loads(line) for line in written.read_text().splitlines()[1:]]
    assert [{k: v for k, v in json.loads(a).items() if k in line} for a, line in
            zip(again[1:], recorded, strict=True)] == [
        {k: line[k] for k in ("result", "error", "events", "fired")} for line in recorded]


MINIMAL_BUGS = ("cached-to-head", "dup-listing-once", "mm-absolute-offset", "null-hashed")
"""The planted bugs a pool of ``--minimal``'s shape can have (the others need masks, groups,
partial entries or watchers)."""


def test_the_rust_pools_minimal_mode_conforms_and_is_never_asked_what_it_lacks(rust_pool: str,
                                                                             tmp_path: Path) -> None:
    """One group, blocks of one hash chunk, no partial entries, watchers, masks or copied keys: the
    process answers any line with what it lacks as a protocol violation, so a single such call would
    fail the run; the first lines say what is not checked, every legal pair of the rest meets."""
    done = kvpool("conform", "--exec", f"{rust_pool} --minimal", "--runs", "2", "--steps", "500",
                  "--examples", "60", "--coverage", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "operations never called: _insert_block_hash, cache_partial_block, unpin_blocks" in done.stdout
    assert "features never made: big_block, group1*," in done.stdout
    met = re.findall(r"feature pairs met in one call: (\d+)/(\d+) legal", done.stdout)
    assert met and met[0][0] == met[0][1] and int(met[0][1]) < 216, done.stdout  # the campaign: all


@pytest.mark.parametrize("bug", MINIMAL_BUGS)
def test_the_minimal_pools_planted_bugs_are_caught(rust_pool: str, bug: str, tmp_path: Path) -> None:
    done = kvpool("conform", "--exec", f"{rust_pool} --minimal --bug {bug}", "--phase", "campaign",
                  "--runs", "2", "--steps", "500", cwd=tmp_path)
    assert done.returncode == 1 and "DIVERGES from the model" in done.stdout, done.stdout + done.stderr
    report = check_trace(tmp_path / "kvpool-drive-campaign.jsonl")
    assert report.divergence is not None and report.steps <= 15, done.stdout


@pytest.mark.parametrize("observe", [False, True])
def test_a_free_across_two_processes_that_one_refuses_changes_neither(rust_pool: str, observe: bool) -> None:
    """Also as the process shows its pool: the mirror shows the pool after the undo."""
    with DriveAdapter([rust_pool, *(["--observe"] if observe else [])]) as adapter:
        first = adapter.construct(6, True, 1, False)
        second = adapter.construct(6, True, 1, False)
        mine = first.get_new_blocks(2)
        theirs = second.get_new_blocks(1)
        before = first.get_num_free_blocks(), first.is_block_writable(mine[0])
        with pytest.raises(DrivenRefusal) as refused:
            first.free_blocks([mine[0], theirs[0], theirs[0]])  # the second pool's block once too often
        assert type(refused.value).__name__ == "BlockNotInUseError"
        if observe:  # before any other call shows the pool again
            assert [b.ref_cnt for b in first.blocks[1:3]] == [1, 1]
            assert first.free_block_queue.num_free_blocks == 3
        assert (first.get_num_free_blocks(), first.is_block_writable(mine[0])) == before
        assert second.get_num_free_blocks() == 4
        first.free_blocks([mine[1], theirs[0]])  # each pool takes back its own
        assert (first.get_num_free_blocks(), second.get_num_free_blocks()) == (4, 5)


# ------------------------------------------------------------ misbehaving processes


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.parametrize(("mode", "extra", "says"), [
    ("crash", [], r"the pool process crashed at call 7 \(\w+\) \(line \d+ of its input\): exited with status "
                  r"101"),
    ("garbage", [], r"the pool process answered garbage at call 7 \(\w+\) \(line \d+ of its input\): answer "
                    r"is not JSON"),
    ("null-events", [], r"the pool process answered garbage at call 7 .*events: expected the list"),
    ("extra", ["--observe"], r"the pool process wrote a line no call asked for at call [78] "),
    ("version", [], r"the pool process speaks another protocol version at the header \(line 1 of its "
                    r"input\): answered in protocol version 2"),
    ("log", [], r"the pool process logged on stdout at the header \(line 1 of its input\): answered "
                r"\"INFO pool starting\""),
    ("refuse", [], r"the pool process refused to make the pool at the header.*: .*no pools today"),
    # A hang is waited out for --timeout seconds: 5, so that a loaded machine's slow start of the
    # process before call 7 is not taken for the hang.
    ("hang", ["--timeout", "5"], r"the pool process hung at call 7 \(\w+\) \(line \d+ of its input\): "
                                 r"gave no answer within 5s"),
    ("spawn", ["--timeout", "5"], r"the pool process hung at call 7"),
    ("linger", [], r"the pool process did not end cleanly: did not exit within 10s"),
    ("wrong", [], r"(num_free: model \d+ \| pool \d+|result: recorded \d+, model \d+)"),
])
def test_a_misbehaving_process_gets_a_verdict_and_leaves_nothing_behind(
        mode: str, extra: list[str], says: str, tmp_path: Path) -> None:
    """A verdict naming the call and its input line, the tail of its stderr once, as text, and a
    trace file; exit 4 (the process failed), but 1 for an answer that differs (a divergence)."""
    pids = tmp_path / "pids"
    flags = [e for e in extra if e == "--observe"]
    options = [e for e in extra if e != "--observe"]
    done = kvpool("conform", "--exec", misbehaving(mode, "--at", "7", "--pids", str(pids), *flags),
                  "--runs", "1", "--steps", "30", "--examples", "5", *options, cwd=tmp_path)
    assert done.returncode == (1 if mode == "wrong" else 4), done.stdout + done.stderr
    assert re.search(says, done.stdout), done.stdout
    assert "Traceback" not in done.stdout + done.stderr and "\\n" not in done.stdout
    if mode not in ("version", "log", "refuse", "wrong"):  # its own stderr line, once a verdict
        verdicts = done.stdout.count("  the process: ")
        assert done.stdout.count(f"| misbehaving at call 7 as asked: {mode}") == verdicts > 0, done.stdout
    if mode not in ("version", "log", "refuse", "linger"):  # the pool's calls as a trace file
        assert list(tmp_path.glob("kvpool-drive-*.jsonl")), done.stdout
    for pid in map(int, pids.read_text().split()):
        assert _gone(pid), f"process {pid} outlived kvpool conform"


@pytest.mark.parametrize(("where", "argv", "code"), [
    ("the campaign", ["--phase", "campaign", "--runs", "2", "--steps", "300"], 4),
    ("the machine", ["--phase", "machine", "--examples", "40"], 4),
    ("a probe", ["--phase", "campaign"], 4),
    ("a shrink", ["--phase", "campaign", "--runs", "1", "--steps", "400"], 1),
])
def test_a_process_failing_at_a_line_anywhere_gets_a_verdict(where: str, argv: list[str], code: int,
                                                              tmp_path: Path) -> None:
    """A process that dies at a line of its input, whatever the call (so that a replay does not
    find it where the run did): during a campaign, the state machine (Hypothesis sees a failure
    that comes and goes), the first pools kvpool makes, or the shrink of a divergence it found
    first.  Always a verdict with its stderr, never a traceback; 1 only for the divergence."""
    line = {"the campaign": "300", "the machine": "300", "a probe": "2", "a shrink": "60"}[where]
    mode = "wrong" if where == "a shrink" else "crash"
    done = kvpool("conform", "--exec", misbehaving(mode, "--at", "40", "--line", line) if mode == "wrong"
                  else misbehaving(mode, "--line", line), *argv, cwd=tmp_path)
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    if mode == "crash":
        assert re.search(rf"the pool process crashed .*line {line} of its input", done.stdout), done.stdout
        assert done.stdout.count(f"| misbehaving at line {line} as asked: crash") >= 1, done.stdout
    if where != "a probe":
        assert list(tmp_path.glob("kvpool-drive-*.jsonl")), done.stdout


def test_a_refusals_message_is_shown(tmp_path: Path) -> None:
    done = kvpool("conform", "--exec", misbehaving("deny", "--at", "9"), "--phase", "campaign", "--runs", "1",
                  "--steps", "50", cwd=tmp_path)
    assert done.returncode == 1 and "no calls on Tuesdays" in done.stdout, done.stdout


def test_check_exec_honours_every_option_check_has(tmp_path: Path) -> None:
    """``--blocks``, ``--long-lived``, ``--lacks`` reach the pools ``check --exec`` makes (its headers
    say so); ``--trace-dir`` is made when missing."""
    log = tmp_path / "headers"
    done = kvpool("check", "--exec", misbehaving("well", "--log", str(log)), "--runs", "1", "--steps", "40",
                  "--blocks", "64", "--lacks", "mask,unpin_blocks",
                  "--trace-dir", str(tmp_path / "new" / "dir"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    sizes = {json.loads(line)["num_blocks"] for line in log.read_text().splitlines()}
    assert 64 in sizes and (tmp_path / "new" / "dir").is_dir()
    assert "not checked, as the pool lacks them" in done.stdout
    assert "operations never called: unpin_blocks" in done.stdout
    log.unlink()
    lived = kvpool("check", "--exec", misbehaving("well", "--log", str(log)), "--runs", "1", "--steps", "40",
                   "--long-lived", cwd=tmp_path)
    assert lived.returncode == 0, lived.stdout + lived.stderr
    assert {json.loads(line)["num_blocks"] for line in log.read_text().splitlines()} & {64, 256, 1024}
    options = {a.dest for a in _check_parser()._actions} - {"help", "exec", "pool"}
    for dest in options:  # every option of check reaches check --exec (read off the namespace)
        assert f"ns.{dest}" in DRIVE_CLI or f"args.{dest}" in CHECK_CLI, dest


def _check_parser() -> Any:
    import argparse

    from kvpool.cli import check

    root = argparse.ArgumentParser()
    return check.add_parser(root.add_subparsers())


DRIVE_CLI = (ROOT / "kvpool" / "cli" / "drive.py").read_text()
CHECK_CLI = (ROOT / "kvpool" / "cli" / "check.py").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_process_dies_with_kvpool_even_when_kvpool_is_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    kvpool_run = subprocess.Popen(
        [sys.executable, "-P", "-m", "kvpool", "conform", "--exec",
         misbehaving("hang", "--at", "3", "--pids", str(pids)), "--timeout", "600"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until the pool process is up (bounded by tries, not a deadline)
            if (pids.exists() and pids.read_text().strip()) or kvpool_run.poll() is not None:
                break
            time.sleep(0.1)
        assert kvpool_run.poll() is None, "kvpool ended before its pool process hung"
        (pid,) = map(int, pids.read_text().split())
        kvpool_run.kill()  # SIGKILL: no atexit, no finally
        kvpool_run.wait()
        for _ in range(100):
            if _gone(pid):
                break
            time.sleep(0.05)
        assert _gone(pid), f"process {pid} outlived a killed kvpool"
    finally:
        kvpool_run.kill()


def test_usage_errors_of_exec(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    for argv, says in [(["--exec", ""], "empty command"),
                       (["--exec", "no-such-binary-kvpool"], "cannot start"),
                       (["--exec", SERVE, "--timeout", "0"], "--timeout must be positive"),
                       (["--exec", SERVE, "--trace-dir", str(tmp_path / "file" / "no")], "--trace-dir")]:
        done = kvpool("conform", *argv, cwd=tmp_path)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    both = kvpool("conform", "--exec", SERVE, "--impl", "kvpool.impl:BlockPool", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_processes_end_with_the_adapter(rust_pool: str) -> None:
    adapter = DriveAdapter([rust_pool])
    adapter.construct(4, True, 1, False)
    adapter.construct(4, True, 1, False)
    pids = [slot.process.popen.pid for slot in adapter.slots if slot.process.popen is not None]
    assert len(pids) == 2
    assert adapter.close() == []  # each exited at the end of its stdin, with status 0
    assert all(_gone(pid) for pid in pids)

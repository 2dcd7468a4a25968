"""The shared failure database: a failure one shard's state machine finds is replayed first by another.

``KVPOOL_EXAMPLE_DB`` names Hypothesis' example database: a directory, or
``redis://HOST:PORT/N`` (Hypothesis' ``RedisExampleDatabase``).  The Redis test
starts a real ``redis-server`` on loopback (Debian's package; ``.ci/run``
installs it when missing) and is skipped, saying so, without one.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import conform as conform_cli
from kvpool.oracle.search.database import ExampleDatabaseError, describe, example_database

BROKEN = "kvpool.bugs.pools:FreeHashedToHead"
ARGS = ["--impl", BROKEN, "--runs", "1", "--steps", "30", "--examples", "60", "--machine-steps", "25"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    pytest.importorskip("redis", reason="the redis package is not installed (pip install 'kvpool[redis]')")
    import redis

    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_connect_timeout=1)
        for _ in range(1200):  # a safety net, not a verdict: a loaded machine may start it slowly
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer within 60 s")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def shard(i: int, db: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
          *extra: str) -> dict[str, Any]:
    if db is None:
        monkeypatch.delenv("KVPOOL_EXAMPLE_DB", raising=False)
    else:
        monkeypatch.setenv("KVPOOL_EXAMPLE_DB", db)
    out = tmp_path / f"shard-{i}-{len(list(tmp_path.iterdir()))}.json"
    code = conform_cli.main([*ARGS, *extra, "--shard", f"{i}/2", "--json", str(out)], out=io.StringIO())
    doc = dict(json.loads(out.read_text()))
    assert code == 1 and not doc["ok"]
    return doc


def machine(doc: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in doc["phases"] if p["name"] == "machine")


@pytest.mark.parametrize("kind", ["redis", "directory"])
def test_a_failure_one_shard_finds_is_replayed_first_by_another(
        kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    db = request.getfixturevalue("redis_url") if kind == "redis" else str(tmp_path / "examples")
    # Without a shared database shard 2 finds the bug by generating examples of its own.
    alone = machine(shard(2, None, monkeypatch, tmp_path))
    assert not alone["ok"] and not alone["replayed"]
    # Shard 1 finds it, generating, and saves it shrunk ...
    first = machine(shard(1, db, monkeypatch, tmp_path))
    assert not first["ok"] and not first["replayed"]
    # ... and shard 2, with its own seed and examples, replays it before generating anything.
    second = shard(2, db, monkeypatch, tmp_path)
    replay = machine(second)
    assert not replay["ok"] and replay["replayed"]
    assert replay["executed"] < alone["executed"]
    assert replay["failure"]["trace"] == first["failure"]["trace"]
    assert second["settings"]["database"] == describe(db)
    # The database's key is per implementation: another pool does not replay this one's failure.
    monkeypatch.setenv("KVPOOL_EXAMPLE_DB", db)
    other = tmp_path / "other.json"
    assert conform_cli.main(["--impl", "kvpool.bugs.pools:UnpinKeepsReference", *ARGS[2:], "--shard", "2/2",
                             "--json", str(other)], out=io.StringIO()) == 1
    assert not machine(json.loads(other.read_text()))["replayed"]


@pytest.mark.parametrize("spec, message", [
    ("http://host/0", "only redis://"), ("redis:///0", "expected redis://HOST:PORT/N"),
    ("redis://h:port/0", "port is not a number"), ("redis://h:1/x", "expected redis://HOST:PORT/N")])
def test_a_bad_database_url_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ExampleDatabaseError, match=message):
        example_database(spec)


def test_an_unreachable_database_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("redis")
    monkeypatch.setenv("KVPOOL_EXAMPLE_DB", f"redis://:secret@127.0.0.1:{free_port()}/0")
    assert conform_cli.main(["--impl", "kvpool.impl:BlockPool"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "KVPOOL_EXAMPLE_DB" in line and "no Redis server answers" in line and "secret" not in line

"""Hypothesis' example database named by ``KVPOOL_EXAMPLE_DB``: a directory, or a Redis server.

A failure the state machine finds is saved there, shrunk; the next run that
uses the same database replays it before generating anything.  A directory
is shared only by processes that see it; ``redis://HOST:PORT/N`` (Hypothesis'
own :class:`~hypothesis.extra.redis.RedisExampleDatabase`, which needs the
``redis`` package: ``pip install 'kvpool[redis]'``) is shared by every runner
that reaches the server, so a failure found by one shard of a CI matrix is
replayed first by the others.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

ENV = "KVPOOL_EXAMPLE_DB"


class ExampleDatabaseError(ValueError):
    """A ``KVPOOL_EXAMPLE_DB`` that names no usable database."""


CACHE_ENV = "KVPOOL_CACHE"


def cache_dir() -> str:
    """Where kvpool keeps files between runs: ``$KVPOOL_CACHE``, else ``$XDG_CACHE_HOME/kvpool``,
    else ``~/.cache/kvpool`` (never the current directory)."""
    if os.environ.get(CACHE_ENV):
        return os.path.abspath(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "kvpool")


def use_cache_dir() -> str:
    """Point Hypothesis' own files (its ``.hypothesis`` folder) into :func:`cache_dir`; the folder.

    Hypothesis writes them under the current directory otherwise.  The
    example database stays what ``KVPOOL_EXAMPLE_DB`` names (none when unset),
    so that a run does not replay what earlier runs found unless asked to.
    """
    path = os.path.join(cache_dir(), "hypothesis")
    set_hypothesis_home_dir(path)
    return path


def from_env() -> str | None:
    """The database ``KVPOOL_EXAMPLE_DB`` names, if it is set and not empty."""
    return os.environ.get(ENV) or None


def describe(spec: str) -> str:
    """``spec`` without a password, for logs and result documents."""
    if not spec.startswith("redis://"):
        return spec
    parts = urlsplit(spec)
    port = parts.netloc.rpartition("@")[2].partition(":")[2] or "6379"
    return f"redis://{parts.hostname or ''}:{port}{parts.path or '/0'}"


def example_database(spec: str, *, check: bool = False) -> ExampleDatabase:
    """The database ``spec`` names: ``redis://[:PASSWORD@]HOST[:PORT][/N]`` or a directory path.

    With ``check`` a Redis server must answer a ping (within 5 s) and a
    directory must be creatable; either failure raises
    :class:`ExampleDatabaseError`, as does a malformed URL or a missing
    ``redis`` package.
    """
    if "://" not in spec:
        if check:
            try:
                os.makedirs(spec, exist_ok=True)
            except OSError as exc:
                raise ExampleDatabaseError(f"{spec!r}: cannot create the directory: "
                                           f"{exc.strerror or exc}") from None
        return DirectoryBasedExampleDatabase(spec)
    parts = urlsplit(spec)
    if parts.scheme != "redis":
        raise ExampleDatabaseError(f"{describe(spec)!r}: only redis:// URLs or directory paths")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ExampleDatabaseError(f"{describe(spec)!r}: the port is not a number") from None
    path = parts.path.strip("/") or "0"
    if not parts.hostname or not path.isdigit():
        raise ExampleDatabaseError(f"{describe(spec)!r}: expected redis://HOST:PORT/N")
    try:
        # lazy: the redis extra, only for a redis:// database
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise ExampleDatabaseError(f"{describe(spec)!r} needs the redis package: "
                                   "pip install 'kvpool[redis]'") from None
    client = redis.Redis(host=parts.hostname, port=port, db=int(path), password=parts.password,
                         socket_timeout=5, socket_connect_timeout=5)
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ExampleDatabaseError(f"{describe(spec)!r}: no Redis server answers: {exc}") from None
    return RedisExampleDatabase(client)


__all__ = ["CACHE_ENV", "ENV", "ExampleDatabaseError", "cache_dir", "describe", "example_database",
           "from_env", "use_cache_dir"]

"""Engines survive fork: a child never talks on its parent's pooled connections."""

from __future__ import annotations

import multiprocessing
import os

from sqlalchemy import text

from controlplane import db

ROUNDS = 150
CHILDREN = 4


def echo_loop(engine, tag: str) -> None:
    """Each answer must be this process's own question (shared sockets mix them up)."""
    for i in range(ROUNDS):
        asked = f"{tag}-{i}"
        with engine.connect() as conn:
            answered = conn.execute(text("SELECT CAST(:v AS text), pg_backend_pid()"), {"v": asked})
            value, _backend = answered.one()
        assert value == asked, f"{tag} asked {asked!r}, got {value!r}"


def child(engine, results) -> None:
    try:
        echo_loop(engine, f"child{os.getpid()}")
        results.put(("ok", os.getpid()))
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))
    results.close()
    results.join_thread()
    # A test worker that ran Prefect before forks its at-exit services too, and they
    # fail in a child; this child's verdict is already on the queue.
    os._exit(0)


def test_forked_children_get_their_own_connections(database_url):
    engine = db.create(database_url)
    try:
        echo_loop(engine, "parent-before")
        with engine.connect() as conn:
            parent_backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        fork = multiprocessing.get_context("fork")
        results = fork.Queue()
        children = [fork.Process(target=child, args=(engine, results)) for _ in range(CHILDREN)]
        for process in children:
            process.start()
        echo_loop(engine, "parent-during")
        outcomes = [results.get(timeout=120) for _ in children]
        for process in children:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        assert all(status == "ok" for status, _ in outcomes), outcomes
        assert [p.exitcode for p in children] == [0] * CHILDREN, "a child crashed"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == parent_backend
    finally:
        engine.dispose()

"""Opening the state databases (rollout_server/database.py): SQLite or PostgreSQL, any other URL refused, and one
that cannot be opened is an error naming the URL without its password, from the first call and from
`rollout-serve up` before anything starts."""

import logging
import socket

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from rollout_server import cli
from rollout_server.database import DatabaseError, open_engine, redacted
from rollout_server.harness.stack import free_port_block
from rollout_server.settings import Settings

PASSWORD = "s3cret-pw"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]   # nothing listens once the socket is closed


def test_both_backends_open_and_postgresql_url_means_psycopg(database_url):
    engine = open_engine(database_url.replace("postgresql+psycopg://", "postgresql://"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    assert engine.dialect.name in ("sqlite", "postgresql")
    assert engine.dialect.driver in ("pysqlite", "psycopg")
    engine.dispose()


@pytest.mark.postgres
def test_an_unreachable_or_missing_database_names_the_url_without_its_password(postgres_server):
    unreachable = f"postgresql://alice:{PASSWORD}@127.0.0.1:{closed_port()}/state"
    with pytest.raises(DatabaseError) as refused:
        open_engine(unreachable)
    message = str(refused.value)
    assert PASSWORD not in message and "Connection refused" in message
    assert f"postgresql://alice:***@127.0.0.1:{unreachable.rsplit(':', 1)[1]}" in message

    missing = postgres_server.url("no_such_database")
    with pytest.raises(DatabaseError, match='database "no_such_database" does not exist'):
        open_engine(missing)


def test_urls_of_other_databases_are_refused_when_settings_are_read():
    with pytest.raises(ValidationError, match="use sqlite:///PATH or postgresql://") as refused:
        Settings(database_url=f"mysql://bob:{PASSWORD}@db/state")
    assert "mysql://bob:***@db/state" in str(refused.value)
    with pytest.raises(ValidationError, match="unsupported database URL"):
        Settings(batches={"database_url": "state.db"})
    assert redacted(f"postgresql://bob:{PASSWORD}@db:5432/x") == "postgresql://bob:***@db:5432/x"


def refuse_to_start(*args, **kwargs):
    raise AssertionError("`up` went past its start-up checks")


def test_up_fails_at_start_on_an_unreachable_database(monkeypatch, caplog):
    monkeypatch.setattr("rollout_server.tiny_model.builder.resolve_model", refuse_to_start)
    url = f"postgresql://alice:{PASSWORD}@127.0.0.1:{closed_port()}/state"
    with caplog.at_level(logging.ERROR):
        assert cli.main(["up", "--port", str(free_port_block(1)), "--database-url", url]) == 1
    assert "cannot open the database postgresql://alice:***@127.0.0.1:" in caplog.text
    assert PASSWORD not in caplog.text

    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert cli.main(["up", "--batches-database-url", f"mysql://bob:{PASSWORD}@db/x"]) == 2
    assert "setting batches.database_url: Value error, unsupported database URL" in caplog.text
    assert PASSWORD not in caplog.text


@pytest.mark.postgres
def test_the_test_server_is_real_and_listens_on_its_socket_only(postgres_server):
    engine = open_engine(postgres_server.new_database())
    with engine.connect() as conn:
        assert conn.execute(text("SHOW listen_addresses")).scalar() == ""
        assert conn.execute(text("SELECT current_setting('server_version_num')::int")).scalar() >= 130000
    engine.dispose()

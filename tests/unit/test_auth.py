"""API keys: hashed at rest, mapped to teams; open local mode only when set, for loopback callers; changes made
with `rollout-serve keys` reach a running server within its recheck delay, read off the event loop."""

import asyncio
import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, create_engine, select

from engine.client.dispatch import Dispatcher
from engine.client.dynamo_http import DynamoFrontendClient
from engine.supervisor.pool_config import PoolConfig
from engine.supervisor.pools import Deployment, Pool, PoolSet
from finetune_deploy.served_models import ModelTable
from rollout_server.app import AppState, create_app
from rollout_server.auth import OPEN_MODE_PRINCIPAL, Authenticator, KeyStore, open_database
from rollout_server.harness.stack import create_key, free_port_block
from rollout_server.metrics import Metrics
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings
from rollout_server.tokenizer import ModelTokenizer
from tests.tiny_models import untrained_tiny_model
from tests.usage.support import ManualClock


@pytest.fixture(scope="module")
def model_dir():
    return untrained_tiny_model()


def make_app(model_dir, database_url: str, clock=None, open_mode: bool = False) -> TestClient:
    """The front door without an engine behind it; its test client calls from loopback."""
    settings = Settings(database_url=database_url)
    nowhere = f"http://127.0.0.1:{free_port_block(1)}"  # no engine listens here: requests must fail cleanly
    pool = Pool(PoolConfig(name="default", kind="shared"), [Deployment("default/0", None, DynamoFrontendClient(nowhere, 10), 1)])
    client = Dispatcher(PoolSet(settings, [pool]), retry_delay_s=0.01)
    ctx = ServingContext(settings=settings, tokenizer=ModelTokenizer(model_dir), client=client,
                         metrics=Metrics(), models=ModelTable("tiny-qwen2", 0, str(model_dir)), max_model_len=32768)
    auth = Authenticator(KeyStore(open_database(database_url)), recheck_s=2.0, clock=clock or ManualClock(),
                         open_mode=open_mode)
    return TestClient(create_app(AppState(ctx=ctx, auth=auth)), client=("127.0.0.1", 50000))


def stored_text(url: str) -> str:
    """Every value of every table of the database, as text."""
    engine = create_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    with engine.connect() as conn:
        text = repr([conn.execute(select(table)).all() for table in tables.sorted_tables])
    engine.dispose()
    return text


def test_keys_map_to_teams_and_are_stored_hashed(database_url, model_dir):
    url = database_url
    key = create_key(url, "team-a")
    stored = stored_text(url)
    assert key.startswith("rs-") and key not in stored and "team-a" in stored
    app = make_app(model_dir, url)

    missing = app.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = app.get("/v1/models", headers={"Authorization": "Bearer rs-not-a-key"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    ok = app.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "tiny-qwen2"

    store = KeyStore(open_database(url))
    assert store.lookup(key).team == "team-a"
    assert store.revoke(key[:10]) == 1
    assert store.lookup(key) is None


def test_open_mode_without_keys_and_503_when_the_engine_is_unreachable(database_url, model_dir):
    with make_app(model_dir, database_url, open_mode=True) as app:  # its shutdown closes the engine client
        assert app.get("/v1/models").status_code == 200
        resp = app.post("/v1/chat/completions", json={"model": "tiny-qwen2", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 503
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert resp.headers["retry-after"] == "1"


def test_a_key_revoked_while_the_server_runs_stops_working_within_the_recheck_delay(database_url, model_dir):
    url = database_url
    key = create_key(url, "team-a")
    clock = ManualClock()
    app = make_app(model_dir, url, clock)
    bearer = {"Authorization": f"Bearer {key}"}
    assert app.get("/v1/models", headers=bearer).status_code == 200

    KeyStore(open_database(url)).revoke(key[:10])  # as `rollout-serve keys revoke` does, from another process
    clock.advance(1.9)
    assert app.get("/v1/models", headers=bearer).status_code == 200  # read 1.9 s ago: still trusted
    clock.advance(0.1)
    refused = app.get("/v1/models", headers=bearer)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_a_new_key_works_at_once_and_in_open_mode_a_key_is_its_team(database_url, model_dir):
    url = database_url
    closed = make_app(model_dir, url)
    assert closed.get("/v1/models").status_code == 401  # no key yet, and open mode is off
    first = create_key(url, "team-a")  # never read before: looked up on its first use
    assert closed.get("/v1/models", headers={"Authorization": f"Bearer {first}"}).status_code == 200

    open_mode = Authenticator(KeyStore(open_database(url)), open_mode=True)
    assert asyncio.run(open_mode.authenticate(None, "127.0.0.1")) == OPEN_MODE_PRINCIPAL
    assert asyncio.run(open_mode.authenticate("Bearer placeholder", "::1")) == OPEN_MODE_PRINCIPAL
    assert asyncio.run(open_mode.authenticate(f"Bearer {first}", "127.0.0.1")).team == "team-a"


class ThreadRecordingKeyStore(KeyStore):
    """Test double: a real key store that notes which thread each database read ran on."""

    def __init__(self, engine):
        super().__init__(engine)
        self.read_on: list[threading.Thread] = []

    def has_keys(self) -> bool:
        self.read_on.append(threading.current_thread())
        return super().has_keys()

    def lookup(self, key: str):
        self.read_on.append(threading.current_thread())
        return super().lookup(key)


def test_the_database_is_read_off_the_event_loop_and_a_key_once_per_recheck_delay(database_url):
    url = database_url
    key = create_key(url, "team-a")
    store = ThreadRecordingKeyStore(open_database(url))
    auth = Authenticator(store, recheck_s=60)
    store.read_on.clear()  # the start-up check, before any event loop

    async def three_requests():
        return [await auth.authenticate(f"Bearer {key}") for _ in range(3)], threading.current_thread()

    principals, loop_thread = asyncio.run(three_requests())
    assert [p.team for p in principals] == ["team-a"] * 3
    assert len(store.read_on) == 1 and store.read_on[0] is not loop_thread


def test_a_team_name_no_database_can_store_is_refused(database_url):
    store = KeyStore(open_database(database_url))
    for team in ["", "t" * 129, "a\x00b"]:
        with pytest.raises(ValueError, match="team name is 1 to 128 characters"):
            store.create(team)
    assert store.list() == []
    longest = "t" * 128
    assert store.lookup(store.create(longest)).team == longest

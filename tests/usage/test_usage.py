"""Usage accounting: stored totals equal the sum of the recorded requests, however grouped;
writing happens off the event loop and nothing is lost on close; a team sees only its own usage."""

import argparse
import asyncio
import csv
import datetime as dt
import io
import json
import random
import threading
import time
from collections import defaultdict

import pytest
from sqlalchemy import create_engine

from engine.ids import DEFAULT_POOL
from rollout_server.cli.usage import add_usage_commands
from rollout_server.routes.usage import usage_router
from rollout_server.serving.finished import FinishedGeneration
from rollout_server.usage import UsageEvent, UsageQuery, UsageRecorder, UsageStore
from tests.usage.support import as_team, client_for, principal_from_test_header

DAY0 = dt.datetime(2025, 3, 1, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def store(database_url):
    return UsageStore(create_engine(database_url))


def random_events(count: int, seed: int = 7) -> list[UsageEvent]:
    rng = random.Random(seed)
    events = []
    for _ in range(count):
        team = rng.choice(["team-a", "team-b", "team-c"])
        events.append(UsageEvent(
            team=team, key_prefix=rng.choice([f"rs-{team[-1]}1", f"rs-{team[-1]}2", None]),
            model=rng.choice(["qwen-a", "qwen-b"]), pool=rng.choice([DEFAULT_POOL, "rl"]),
            created_at=DAY0 + rng.uniform(0, 3 * 86400), prompt_tokens=rng.randint(1, 500),
            cached_tokens=rng.randint(0, 100), completion_tokens=rng.randint(0, 300), wall_s=rng.uniform(0.01, 3)))
    return events


def expected_totals(events: list[UsageEvent], group_by: tuple[str, ...]) -> dict[tuple, dict]:
    """The reference: plain Python sums over the individual requests."""
    def group_of(event: UsageEvent) -> tuple:
        values = {"team": event.team, "key": event.key_prefix, "model": event.model, "pool": event.pool,
                  "day": dt.datetime.fromtimestamp(event.created_at, dt.timezone.utc).date().isoformat()}
        return tuple(values[name] for name in group_by)

    sums: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    for event in events:
        row = sums[group_of(event)]
        row["requests"] += 1
        row["prompt_tokens"] += event.prompt_tokens
        row["cached_tokens"] += event.cached_tokens
        row["completion_tokens"] += event.completion_tokens
        row["wall_s"] += event.wall_s
    return sums


def stored_totals(store: UsageStore, query: UsageQuery) -> dict[tuple, dict]:
    return {tuple(row.group[name] for name in query.group_by): row.to_json() for row in store.totals(query)}


def assert_same_totals(stored: dict[tuple, dict], expected: dict[tuple, dict]) -> None:
    assert stored.keys() == expected.keys()
    for group, want in expected.items():
        got = stored[group]
        for name in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens"):
            assert got[name] == want[name], (group, name)
        assert got["wall_s"] == pytest.approx(want["wall_s"])
        assert got["total_tokens"] == want["prompt_tokens"] + want["completion_tokens"]


def finished_generation(team: str, key_prefix: str | None, prompt: int, completion: int, cached: int = 0,
                        created_at: float = DAY0, model: str = "qwen-a") -> FinishedGeneration:
    generation = FinishedGeneration(
        request_id=f"chatcmpl-{random.random()}", session_id="s", team=team, model=model, endpoint="chat.completions",
        policy_version=0, prompt_token_ids=list(range(prompt)), choices=[], worker_id=None, prompt_tokens=prompt,
        completion_tokens=completion, cached_tokens=cached, created_at=created_at, ttft_s=None, inter_token_s=[],
        total_s=0.25, request_body={})
    generation.key_prefix = key_prefix   # the field proposed for FinishedGeneration
    return generation


@pytest.mark.parametrize("group_by", [(), ("team",), ("team", "key"), ("model", "pool"), ("day",),
                                      ("team", "key", "model", "pool", "day")])
def test_totals_equal_the_sum_of_recorded_requests(store, group_by):
    events = random_events(400)
    recorder = UsageRecorder(store)
    for event in events:
        recorder.record(event)
    recorder.close()   # never started: close() alone writes everything
    assert_same_totals(stored_totals(store, UsageQuery(group_by=group_by)), expected_totals(events, group_by))


def test_time_range_and_filters_select_the_matching_requests(store):
    events = random_events(300, seed=11)
    recorder = UsageRecorder(store)
    for event in events:
        recorder.record(event)
    recorder.flush()
    since, until = DAY0 + 86400, DAY0 + 2 * 86400   # whole minutes, so minute resolution is exact here
    chosen = [e for e in events if since <= e.created_at < until and e.team == "team-b" and e.model == "qwen-b"]
    query = UsageQuery(team="team-b", model="qwen-b", since=since, until=until, group_by=("key",))
    assert_same_totals(stored_totals(store, query), expected_totals(chosen, ("key",)))
    assert chosen  # the seed gives a non-empty selection, so the comparison above means something


def test_on_finish_is_written_by_the_writer_thread_and_close_loses_nothing(database_url):
    writer_threads = []

    class ThreadRecordingUsageStore(UsageStore):
        """Test double: notes which thread inserts."""

        def add(self, minutes):
            writer_threads.append(threading.current_thread().name)
            super().add(minutes)

    store = ThreadRecordingUsageStore(create_engine(database_url))
    recorder = UsageRecorder(store, flush_every_s=0.05)
    recorder.start()

    async def serve_requests():
        for i in range(50):
            await recorder.on_finish(finished_generation("team-a", "rs-a1", prompt=10, completion=i))

    asyncio.run(serve_requests())
    deadline = time.monotonic() + 5
    while not writer_threads and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writer_threads and set(writer_threads) == {"usage-writer"}

    asyncio.run(serve_requests())   # more requests, then a clean shutdown right away
    recorder.close()
    [row] = store.totals(UsageQuery(group_by=("team", "key")))
    assert row.group == {"team": "team-a", "key": "rs-a1"}
    assert row.counts.requests == 100
    assert row.counts.prompt_tokens == 1000
    assert row.counts.completion_tokens == 2 * sum(range(50))
    assert row.counts.wall_s == pytest.approx(25.0)


def test_a_failed_write_keeps_the_counts_for_the_next_flush(database_url):
    class FailingOnceUsageStore(UsageStore):
        """Test double: the database refuses the first insert."""

        failed = False

        def add(self, minutes):
            if not self.failed:
                self.failed = True
                raise OSError("database unavailable")
            super().add(minutes)

    store = FailingOnceUsageStore(create_engine(database_url))
    recorder = UsageRecorder(store)
    events = random_events(50)
    for event in events:
        recorder.record(event)
    with pytest.raises(OSError):
        recorder.flush()
    recorder.record(events[0])
    recorder.flush()
    assert_same_totals(stored_totals(store, UsageQuery()), expected_totals(events + [events[0]], ()))


def test_usage_api_shows_a_team_only_its_own_usage(store):
    recorder = UsageRecorder(store)
    asyncio.run(recorder.on_finish(finished_generation("team-a", "rs-a1", prompt=100, completion=10)))
    asyncio.run(recorder.on_finish(finished_generation("team-b", "rs-b1", prompt=7, completion=3)))
    recorder.flush()
    client = client_for(usage_router(store, principal_from_test_header))

    own = client.get("/v1/usage", params={"group_by": "team"}, headers=as_team("team-a"))
    assert own.status_code == 200
    assert [(r["team"], r["requests"], r["prompt_tokens"]) for r in own.json()["data"]] == [("team-a", 1, 100)]

    other = client.get("/v1/usage", params={"team": "team-b"}, headers=as_team("team-a"))
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden_team"

    admin_one = client.get("/v1/usage", params={"team": "team-b", "group_by": "team"}, headers=as_team("admins"))
    assert [(r["team"], r["total_tokens"]) for r in admin_one.json()["data"]] == [("team-b", 10)]
    admin_all = client.get("/v1/usage", params={"group_by": "team"}, headers=as_team("admins"))
    assert [r["team"] for r in admin_all.json()["data"]] == ["team-a", "team-b"]


def test_usage_api_time_range_group_by_and_bad_parameters(store):
    recorder = UsageRecorder(store)
    for day in range(3):
        generation = finished_generation("team-a", "rs-a1", prompt=10 * (day + 1), completion=1,
                                         created_at=DAY0 + day * 86400 + 3600)
        asyncio.run(recorder.on_finish(generation))
    recorder.flush()
    client = client_for(usage_router(store, principal_from_test_header))

    iso = client.get("/v1/usage", params={"since": "2025-03-02", "until": "2025-03-03T00:00:00Z", "group_by": "day"},
                     headers=as_team("team-a"))
    assert iso.status_code == 200
    assert [(r["day"], r["prompt_tokens"]) for r in iso.json()["data"]] == [("2025-03-02", 20)]
    unix = client.get("/v1/usage", params={"since": str(DAY0 + 86400), "group_by": ["model", "day"]},
                      headers=as_team("team-a"))
    assert [(r["model"], r["day"], r["prompt_tokens"]) for r in unix.json()["data"]] == [
        ("qwen-a", "2025-03-02", 20), ("qwen-a", "2025-03-03", 30)]

    bad_group = client.get("/v1/usage", params={"group_by": "colour"}, headers=as_team("team-a"))
    assert bad_group.status_code == 400 and bad_group.json()["error"]["param"] == "group_by"
    for since in ("yesterday", "nan", "inf", "1e400", "99999999999999999999"):  # the last three were 500s
        bad_time = client.get("/v1/usage", params={"since": since}, headers=as_team("team-a"))
        assert bad_time.status_code == 400 and bad_time.json()["error"]["param"] == "since", since


def run_cli(argv: list[str], capsys) -> str:
    parser = argparse.ArgumentParser(prog="rollout-serve")
    add_usage_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_usage_command_prints_table_csv_and_json(database_url, store, capsys):
    events = random_events(120, seed=3)
    recorder = UsageRecorder(store)
    for event in events:
        recorder.record(event)
    recorder.close()
    expected = expected_totals([e for e in events if e.team == "team-c"], ("model",))
    common = ["usage", "--database-url", database_url, "--team", "team-c", "--group-by", "model"]

    rows = list(csv.DictReader(io.StringIO(run_cli(common + ["--format", "csv"], capsys))))
    prompt_tokens = {r["model"]: int(r["prompt_tokens"]) for r in rows}
    assert prompt_tokens == {k[0]: v["prompt_tokens"] for k, v in expected.items()}

    records = json.loads(run_cli(common + ["--format", "json"], capsys))
    assert {r["model"]: r["requests"] for r in records} == {k[0]: v["requests"] for k, v in expected.items()}

    table = run_cli(common + ["--since", "2025-03-01T00:00:00"], capsys).splitlines()
    assert table[0].split()[:3] == ["model", "requests", "prompt_tokens"]
    assert [line.split()[0] for line in table[1:]] == sorted(k[0] for k in expected)

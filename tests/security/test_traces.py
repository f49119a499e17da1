"""Security of the trace store (#46, items 4 and 5): one bad record loses nothing else, secrets are redacted in text
and token ids, the files are private, retention bounds each team, and a store that cannot be written counts what
it loses. Every test runs the real store (WAL + Parquet) in a temporary directory."""
from __future__ import annotations

import asyncio
import time

import pytest
from transformers import AutoTokenizer

from engine.contract import SampledToken
from rollout_server.metrics import Metrics
from rollout_server.serving.finished import ChoiceResult, FinishedGeneration
from rollout_server.tracing import TraceHook
from tests.tiny_models import untrained_tiny_model
from tests.traces.trace_factory import make_record
from trace_pipeline.capture import TraceCapture
from trace_pipeline.records import RewardRecord
from trace_pipeline.redact import REDACTED_TOKEN_ID, TokenPieces, redact_record, redact_text
from trace_pipeline.retention import DAY_S, sweep
from trace_pipeline.settings import TraceSettings
from trace_pipeline.store import TraceStore

TEAMS = [f"team-{i}" for i in range(8)]


def nested(depth: int):
    """A JSON value nested `depth` levels deep, as a client can send inside a chat message."""
    value = "leaf"
    for _ in range(depth):
        value = {"x": [value]}
    return value


def capture_in(tmp_path, **overrides) -> TraceCapture:
    return TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60, ack="enqueue", **overrides))


def commit_together(capture: TraceCapture, records) -> None:
    """Queues every record before the writer starts, so that they share one group commit; then stores them."""
    for record in records:
        capture.record_sync(record)
    capture.start()
    capture.close()


def stored(capture: TraceCapture, team: str) -> list[dict]:
    return capture.store.read_table(team).to_pylist()


def test_a_message_nested_700_deep_loses_only_itself_its_field_and_no_neighbour(tmp_path):
    capture = capture_in(tmp_path)
    bad = make_record("bad", team="team-0", messages=[{"role": "user", "content": "hi", "extra": nested(700)}])
    neighbours = [make_record(f"ok-{team}", team=team) for team in TEAMS]
    commit_together(capture, [bad, *neighbours])

    for team in TEAMS:
        rows = {row["request_id"]: row for row in stored(capture, team)}
        assert f"ok-{team}" in rows, f"{team} lost its trace to another team's bad record"
        assert rows[f"ok-{team}"]["dropped_fields"] is None
    bad_row = {row["request_id"]: row for row in stored(capture, "team-0")}["bad"]
    assert bad_row["dropped_fields"] == ["request_messages"]
    assert bad_row["request_messages"] is None
    assert bad_row["prompt_token_ids"] == bad.prompt_token_ids   # the rest of the record is kept
    assert bad_row["output_message"] is not None
    assert capture.stats["fields_dropped"] == 1 and capture.stats["write_errors"] == 0


def test_a_record_unencodable_without_its_free_form_fields_is_refused_alone_and_counted(tmp_path):
    capture = capture_in(tmp_path)
    bad = make_record("bad", team="team-0")
    bad.worker_ids = [object()]   # no encoding for it, and it is not a field the salvage may drop
    commit_together(capture, [bad, *(make_record(f"ok-{team}", team=team) for team in TEAMS)])

    for team in TEAMS:
        assert [row["request_id"] for row in stored(capture, team)] == [f"ok-{team}"]
    assert capture.stats["unstorable"] == 1
    assert capture.stats["written"] == len(TEAMS)


def test_every_file_the_store_writes_is_0600_and_every_directory_0700(tmp_path):
    capture = TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60))
    capture.start()
    capture.record_sync(make_record("r1"))
    wal_files = list(capture.store.wal_dir.glob("*.wal"))
    capture.store.append_rewards([RewardRecord(reward_id="rw1", team="team-a", created_at=1.0, request_id="r1",
                                               reward=1.0)])
    modes_while_open = {path: path.stat().st_mode & 0o777 for path in wal_files}
    capture.close()

    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.parent.name == "rewards" for p in files)
    assert wal_files and set(modes_while_open.values()) == {0o600}
    assert {p: p.stat().st_mode & 0o777 for p in files} == {p: 0o600 for p in files}
    directories = [tmp_path / "store", *(p for p in (tmp_path / "store").rglob("*") if p.is_dir())]
    assert {p: p.stat().st_mode & 0o777 for p in directories} == {p: 0o700 for p in directories}


def finished_generation(request_id: str) -> FinishedGeneration:
    """What the serving path hands its finish hooks after answering a chat request."""
    tokens = [SampledToken(token_id=7, logprob=-0.1, top=[], policy_version=0)]
    return FinishedGeneration(
        request_id=request_id, session_id="s1", team="team-a", model="tiny", endpoint="chat.completions",
        policy_version=0, prompt_token_ids=[1, 2, 3], choices=[ChoiceResult(0, "hi", tokens, "stop",
                                                                            {"role": "assistant", "content": "hi"})],
        worker_id=0, prompt_tokens=3, completion_tokens=1, cached_tokens=0, created_at=time.time(), ttft_s=0.01,
        inter_token_s=[], total_s=0.02, request_body={"messages": [{"role": "user", "content": "hello"}]})


def metric_value(metrics: Metrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("rollout_trace_records", {"outcome": outcome})


def test_a_store_that_cannot_be_written_keeps_serving_and_counts_each_lost_record_in_metrics(tmp_path):
    capture = TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60))
    capture.start()
    metrics = Metrics()
    metrics.watch_traces(lambda: capture.stats)
    hook = TraceHook(capture)
    wal = capture.store.wal_dir
    wal.rename(tmp_path / "wal-elsewhere")
    wal.write_text("a file where the WAL directory should be: no segment can be created")

    async def serve() -> None:
        await asyncio.wait_for(hook(finished_generation("lost")), 1)   # the answer never waits for its trace
        while capture.stats["write_errors"] == 0:
            await asyncio.sleep(0.01)
        wal.unlink()                                                   # space again
        (tmp_path / "wal-elsewhere").rename(wal)
        await hook(finished_generation("kept"))
        await hook.close()

    asyncio.run(asyncio.wait_for(serve(), 30))
    assert capture.store.read_table("team-a")["request_id"].to_pylist() == ["kept"]
    assert metric_value(metrics, "write_errors") == 1
    assert metric_value(metrics, "written") == 1
    assert b'rollout_trace_records{outcome="write_errors"} 1.0' in metrics.render()


NOW = 1_790_000_000.0


def seal_file(store: TraceStore, name: str, records) -> None:
    """One sealed Parquet file (per partition), as the sealer writes it from WAL segment `name`."""
    store.seal(store.wal_dir / f"{name}.wal", records)


def request_ids(store: TraceStore, team: str) -> list[str]:
    return sorted(store.read_table(team, columns=["request_id"])["request_id"].to_pylist())


def team_bytes(store: TraceStore, team: str) -> float:
    """What retention charges a team: its rows' share of each sealed file."""
    total = 0.0
    for sealed_file in store.sealed_files():
        teams = store.sealed.read(sealed_file.path, columns=["team"])["team"].to_pylist()
        total += sealed_file.size * teams.count(team) / len(teams)
    return total


def reward(reward_id: str, team: str, created_at: float) -> RewardRecord:
    return RewardRecord(reward_id=reward_id, team=team, created_at=created_at, request_id="r", reward=1.0)


def test_a_team_over_its_byte_budget_loses_its_oldest_traces_and_no_other_teams(tmp_path):
    store = TraceStore(tmp_path / "store")
    for hour in range(3):   # three sealed files, oldest first; team-a fills them, team-b has one record in each
        at = NOW - (3 - hour) * 3600
        seal_file(store, f"seg-{hour}", [make_record(f"a{hour}-{i}", team="team-a", created_at=at + i,
                                                     completion=list(range(200))) for i in range(20)]
                  + [make_record(f"b{hour}", team="team-b", created_at=at)])
    oldest_file_share = team_bytes(store, "team-a") / 3
    budget = int(team_bytes(store, "team-a") - oldest_file_share / 2)   # over by half of one file's share
    assert team_bytes(store, "team-b") < budget

    swept = sweep(store, TraceSettings(retention_days=None, retention_bytes_per_team=budget), now=NOW)

    assert request_ids(store, "team-a") == sorted(f"a{h}-{i}" for h in (1, 2) for i in range(20))
    assert request_ids(store, "team-b") == ["b0", "b1", "b2"]
    assert swept.traces_removed == 20 and dict(swept.by_team) == {"team-a": 20}
    assert team_bytes(store, "team-a") <= budget


def test_traces_and_rewards_older_than_the_retention_age_are_removed(tmp_path):
    store = TraceStore(tmp_path / "store")
    old, young = NOW - 31 * DAY_S, NOW - 29 * DAY_S
    seal_file(store, "seg-mixed", [make_record("old-a", team="team-a", created_at=old),
                                   make_record("young-a", team="team-a", created_at=young),
                                   make_record("old-b", team="team-b", created_at=old)])
    store.append_rewards([reward("rw-old", "team-a", old), reward("rw-young", "team-a", young)])

    swept = sweep(store, TraceSettings(retention_days=30, retention_bytes_per_team=None), now=NOW)

    assert request_ids(store, "team-a") == ["young-a"] and request_ids(store, "team-b") == []
    assert [r.reward_id for r in store.read_rewards()] == ["rw-young"]
    assert (swept.traces_removed, swept.rewards_removed) == (2, 1)


def test_a_team_over_its_byte_budget_loses_its_oldest_reward_rows_only(tmp_path):
    store = TraceStore(tmp_path / "store")
    store.append_rewards([reward(f"a{i}", "team-a", NOW - 100 + i) for i in range(10)]
                         + [reward("b0", "team-b", NOW - 200)])
    row_bytes = next(store.rewards_dir.glob("*.wal")).stat().st_size / 11   # every row encodes to the same size
    budget = int(row_bytes * 7.5)

    sweep(store, TraceSettings(retention_days=None, retention_bytes_per_team=budget), now=NOW)

    assert [r.reward_id for r in store.read_rewards("team-a")] == ["a3", "a4", "a5", "a6", "a7", "a8", "a9"]
    assert [r.reward_id for r in store.read_rewards("team-b")] == ["b0"]


# One secret of each format redaction covers (the secret part only: a URL keeps its user and host).
SECRETS = {
    "rollout_serve_key": ("rs-Q2x9vLmT4kB8nR1zY7wC3pF6hJ0dS5aE-gU_iO2qXk",) * 2,
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0ZWFtLWEifQ.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",) * 2,
    "slack_token": ("xoxb-2048-4096-Tk9qLmZx8RvB3nW7",) * 2,
    "stripe_key": ("sk_live_4eC39HqLyjWDarjtT1zdp7dc",) * 2,
    "stripe_restricted_key": ("rk_live_9fK27HqPyjWDarjtT1zdq4ab",) * 2,
    "stripe_test_key": ("sk_test_51Hx8QmLkR2vT9pZ3yW4nB7cD",) * 2,
    "google_api_key": ("AIzaSyD4kQ7wX2mP9vL3nR8tB6cF1hJ5gZ0sE-y",) * 2,
    "url_password": ("postgres://trainer:Hunter2-Very-Secret@db.internal:5432/runs", "Hunter2-Very-Secret"),
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(untrained_tiny_model()))


@pytest.mark.parametrize("name", SECRETS)
def test_each_secret_format_is_redacted_in_text(name):
    text, secret = SECRETS[name]
    redacted = redact_text(f"connect with {text} please")
    assert secret not in redacted and "[REDACTED:" in redacted, redacted
    assert redacted.startswith("connect with ") and redacted.endswith(" please")


def test_a_listed_key_prefix_is_not_a_secret():
    assert redact_text("revoke rs-AbCdEfG") == "revoke rs-AbCdEfG"


@pytest.mark.parametrize("name", SECRETS)
def test_each_secret_format_is_masked_in_the_token_ids(name, tokenizer):
    text, secret = SECRETS[name]
    prompt, completion = f"my key is {text} ok", f"use {text}."
    rec = make_record("r1", prompt=tokenizer.encode(prompt), completion=tokenizer.encode(completion),
                      messages=[{"role": "user", "content": prompt}],
                      output={"role": "assistant", "content": completion})

    out = redact_record(rec, token_pieces=TokenPieces(tokenizer))

    for ids, before, after in ((out.prompt_token_ids, "my key is", "ok"), (out.completion_token_ids, "use", ".")):
        kept = tokenizer.decode([i for i in ids if i != REDACTED_TOKEN_ID])
        assert REDACTED_TOKEN_ID in ids
        assert not any(secret[i:i + 6] in kept for i in range(len(secret) - 5)), kept   # no 6 characters left
        assert kept.startswith(before) and kept.endswith(after), kept                   # and nothing else masked
    assert len(out.prompt_token_ids) == len(rec.prompt_token_ids)
    assert len(out.completion_token_ids) == len(out.completion_logprobs) == len(rec.completion_token_ids)
    assert out.completion_mask == [0 if i == REDACTED_TOKEN_ID else 1 for i in out.completion_token_ids]
    assert secret not in repr((out.request_messages, out.output_message))


def test_ids_without_a_secret_are_kept_and_untrained_on_nothing(tokenizer):
    rec = make_record("r1", prompt=tokenizer.encode("the skies are clear over ASIA"),
                      completion=tokenizer.encode("gh_pages, bearer of news"))
    out = redact_record(rec, token_pieces=TokenPieces(tokenizer))
    assert out.prompt_token_ids == rec.prompt_token_ids and out.completion_token_ids == rec.completion_token_ids
    assert out.completion_mask is None

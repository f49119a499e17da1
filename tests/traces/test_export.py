import datasets
import pytest
from conftest import sealed_in
from trace_factory import make_record

from rollout_server.cli import main as cli_main
from trace_pipeline.capture import TraceCapture
from trace_pipeline.export import export
from trace_pipeline.rewards import RewardInput, attach_rewards
from trace_pipeline.settings import TraceSettings
from trace_pipeline.store import TraceStore

T0 = 1_700_000_000.0
TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds",
                                           "parameters": {"type": "object", "properties": {}}}}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}


def session_records():
    """team-a: s1 = turn1 -> turn2 (continues), turn3 (branches off turn1's prompt);
    s2 on another model and policy version; team-b: one record."""
    turn1 = make_record("t1", session_id="s1", prompt=[1, 2, 3], completion=[4, 5], created_at=T0,
                        output=CALL)
    turn1.tools = TOOLS
    turn2 = make_record("t2", session_id="s1", prompt=[1, 2, 3, 4, 5, 6], completion=[7, 8],
                        created_at=T0 + 1, messages=[{"role": "user", "content": "hi"}, CALL,
                                                     {"role": "tool", "tool_call_id": "c1", "content": "2"}])
    turn2.completion_policy_versions = [1, 3]  # the weights changed between its two tokens
    turn3 = make_record("t3", session_id="s1", prompt=[1, 2, 3, 99], completion=[100],
                        created_at=T0 + 2)
    other = make_record("o1", session_id="s2", model="org/other", policy_version=2,
                        prompt=[50], completion=[51, 52], created_at=T0 + 3)
    foreign = make_record("b1", session_id="s1", team="team-b", prompt=[1, 2, 3], completion=[4, 5],
                          created_at=T0 + 4)
    return [turn1, turn2, turn3, other, foreign]


@pytest.fixture(scope="module", params=["local", "s3"])
def store(request, tmp_path_factory) -> TraceStore:
    """The session records, written through the real writer, sealed locally or to S3 (each test runs on both)."""
    store_dir = tmp_path_factory.mktemp("export") / "store"
    settings = TraceSettings(dir=store_dir, flush_every_s=60, **sealed_in(request.param, request))
    capture = TraceCapture(settings)
    capture.start()
    for rec in session_records():
        capture.record_sync(rec)
    attach_rewards(capture.store, "team-a", [
        RewardInput(session_id="s1", reward=0.25, advantage=0.1, metrics={"len": 3.0}),
        RewardInput(request_id="t2", reward=1.0, metrics={"pass": 1.0}),
    ])
    attach_rewards(capture.store, "team-b", [RewardInput(request_id="b1", reward=-7.0)])
    capture.close()
    return TraceStore.from_settings(settings)


def load(out_dir):
    return datasets.load_dataset("parquet", data_dir=str(out_dir))["train"]


def export_and_load(store, tmp_path, fmt, team="team-a", **filters):
    rows = export(store, tmp_path / fmt, fmt, team, progress=False, **filters)
    loaded = load(tmp_path / fmt)
    assert len(loaded) == rows
    return loaded


def test_rl_rows_are_branches_with_exact_tokens_logprobs_and_joined_rewards(store, tmp_path):
    recs = {r.request_id: r for r in session_records()}
    rows = {r["request_id"]: r for r in export_and_load(store, tmp_path, "rl")}
    assert set(rows) == {"t2", "t3", "o1"}
    t1, t2 = recs["t1"], recs["t2"]
    assert rows["t2"]["token_ids"] == t2.prompt_token_ids + t2.completion_token_ids
    assert rows["t2"]["mask"] == [0, 0, 0, 1, 1, 0, 1, 1]
    assert rows["t2"]["logprobs"] == [0.0] * 3 + t1.completion_logprobs + [0.0] + t2.completion_logprobs
    assert rows["t2"]["policy_versions"] == [-1, -1, -1, 1, 1, -1, 1, 3]  # each sampled token's weights
    assert rows["t2"]["trajectory_id"] == "t1" and rows["t2"]["num_turns"] == 2
    # t2's own reward beats the session's; the session's advantage and metrics still apply.
    assert (rows["t2"]["reward"], rows["t2"]["advantage"]) == (1.0, 0.1)
    assert rows["t2"]["metrics"] == [{"name": "len", "value": 3.0}, {"name": "pass", "value": 1.0}]
    assert rows["t3"]["token_ids"] == [1, 2, 3, 99, 100] and rows["t3"]["mask"] == [0, 0, 0, 0, 1]
    assert rows["t3"]["reward"] == 0.25 and rows["t3"]["num_turns"] == 1
    assert rows["o1"]["reward"] is None and rows["o1"]["policy_version"] == 2
    assert rows["o1"]["policy_versions"] == [-1, 2, 2]


def test_sft_rows_are_trl_conversations_with_tools(store, tmp_path):
    rows = {r["request_id"]: r for r in export_and_load(store, tmp_path, "sft")}
    assert set(rows) == {"t2", "t3", "o1"}
    messages = rows["t2"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert messages[2]["tool_call_id"] == "c1" and messages[3]["content"] == "hello"
    assert rows["t3"]["tools"] is None


def test_raw_rows_hold_every_record_of_the_team_exactly(store, tmp_path):
    recs = {r.request_id: r for r in session_records()}
    rows = {r["request_id"]: r for r in export_and_load(store, tmp_path, "raw")}
    assert set(rows) == {"t1", "t2", "t3", "o1"}
    for rid, row in rows.items():
        assert row["prompt_token_ids"] == recs[rid].prompt_token_ids
        assert row["completion_token_ids"] == recs[rid].completion_token_ids
        assert row["completion_logprobs"] == recs[rid].completion_logprobs
    assert rows["t2"]["parent_request_id"] == "t1" and rows["t3"]["parent_request_id"] is None
    assert rows["t1"]["is_leaf"] is False and rows["t2"]["is_leaf"] is True


def test_a_team_exports_only_its_own_traces_and_rewards(store, tmp_path):
    rows = export_and_load(store, tmp_path, "rl", team="team-b")
    assert [(r["request_id"], r["reward"]) for r in rows] == [("b1", -7.0)]


def test_filters_select_records(store, tmp_path):
    by_model = export_and_load(store, tmp_path / "m", "raw", model="org/other")
    assert by_model["request_id"] == ["o1"]
    by_version = export_and_load(store, tmp_path / "v", "raw", policy_version=1)
    assert sorted(by_version["request_id"]) == ["t1", "t2", "t3"]
    by_time = export_and_load(store, tmp_path / "t", "raw", since=T0 + 1, until=T0 + 3)
    assert sorted(by_time["request_id"]) == ["t2", "t3"]
    by_session = export_and_load(store, tmp_path / "s", "raw", session_id="s2")
    assert by_session["request_id"] == ["o1"]


def test_cli_export_writes_a_loadable_dataset(store, tmp_path, monkeypatch, request):
    out = tmp_path / "cli"
    where = []
    if not store.sealed.is_local:   # the S3 server named by the environment, as a deployment would name it
        s3 = request.getfixturevalue("s3_server").settings()
        monkeypatch.setenv("ROLLOUT_SERVE_TRACES__S3__ENDPOINT_URL", s3.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_access_key.get_secret_value())
        where = ["--sealed-uri", store.sealed.uri]
    code = cli_main(["traces", "export", "--store", str(store.root), *where, "--format", "rl",
                     "--out", str(out), "--team", "team-a", "--model", "org/model-7b",
                     "--since", "2023-11-14T22:13:20", "--no-progress"])
    assert code == 0
    assert sorted(load(out)["request_id"]) == ["t2", "t3"]


def test_export_refuses_a_directory_with_parquet_files(store, tmp_path):
    export(store, tmp_path / "out", "raw", "team-a", progress=False)
    with pytest.raises(FileExistsError):
        export(store, tmp_path / "out", "raw", "team-a", progress=False)


def test_choices_of_one_request_are_separate_branches_with_their_own_rewards(tmp_path):
    capture = TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60))
    capture.start()
    for choice, completion in enumerate([[7, 8], [9]]):
        capture.record_sync(make_record("req", choice_index=choice, prompt=[1, 2], completion=completion,
                                        created_at=T0))
    attach_rewards(capture.store, "team-a", [RewardInput(request_id="req", advantage=0.5),
                                             RewardInput(request_id="req", choice_index=1, reward=1.0)])
    capture.close()
    rows = sorted(export_and_load(tmp_path / "store", tmp_path, "rl"), key=lambda r: r["choice_index"])
    assert [r["token_ids"] for r in rows] == [[1, 2, 7, 8], [1, 2, 9]]
    assert [(r["reward"], r["advantage"]) for r in rows] == [(None, 0.5), (1.0, 0.5)]


@pytest.mark.parametrize("fmt", ["rl", "sft", "raw"])
def test_an_export_without_matching_traces_writes_no_file(store, tmp_path, fmt):
    assert export(store, tmp_path / fmt, fmt, "team-nobody", progress=False) == 0
    assert list((tmp_path / fmt).iterdir()) == []

import json

import datasets

from rollout_server.cli import main as cli_main
from trace_pipeline.export import export, import_verifiers

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
EPISODE = {
    "id": "ep-1", "reward": 0.75, "metrics": {"turns": 2},
    "trace": {
        "tools": TOOLS,
        "rewards": {"correct": 1.0, "format": 0.5},
        "nodes": [
            {"message": {"role": "system", "content": "be brief"}, "sampled": False, "token_ids": [1, 2]},
            {"message": {"role": "user", "content": "find x"}, "sampled": False, "token_ids": [3, 4, 5]},
            {"message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
             "sampled": True, "token_ids": [6, 7, 8], "mask": [1, 1, 0], "logprobs": [-0.5, -0.25, None]},
            {"message": {"role": "tool", "tool_call_id": "c1", "content": "x=1"}, "sampled": False,
             "token_ids": [9]},
            {"message": {"role": "assistant", "content": "x is 1"}, "sampled": True,
             "token_ids": [10, 11], "logprobs": [-1.0, -2.0]},
        ],
    },
}
# The lenient shapes: a bare Trace line, nodes that are messages, no sampled flag, no logprobs.
BARE_TRACE = {"trace_id": "t-2", "reward": 0.0, "nodes": [
    {"role": "user", "content": "hi", "token_ids": [1]},
    {"role": "assistant", "content": "hey", "token_ids": [2, 3]},
]}


def write_jsonl(path, *lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_verifiers_traces_import_and_export_exactly(tmp_path):
    traces = write_jsonl(tmp_path / "traces.jsonl", EPISODE, BARE_TRACE)
    stored = import_verifiers(tmp_path / "store", traces, team="team-a", model="org/m", policy_version=4)
    assert stored == 3
    export(tmp_path / "store", tmp_path / "rl", "rl", "team-a", progress=False)
    rows = {r["session_id"]: r for r in datasets.load_dataset("parquet", data_dir=str(tmp_path / "rl"))["train"]}
    assert set(rows) == {"vf-ep-1", "vf-t-2"}
    episode = rows["vf-ep-1"]
    assert episode["token_ids"] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert episode["mask"] == [0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert episode["logprobs"] == [0.0] * 5 + [-0.5, -0.25, 0.0, 0.0, -1.0, -2.0]
    assert episode["reward"] == 0.75 and episode["num_turns"] == 2 and episode["policy_version"] == 4
    assert {m["name"]: m["value"] for m in episode["metrics"]} == {"correct": 1.0, "format": 0.5, "turns": 2.0}
    bare = rows["vf-t-2"]
    assert (bare["token_ids"], bare["mask"], bare["logprobs"]) == ([1, 2, 3], [0, 1, 1], [0.0, 0.0, 0.0])
    assert bare["reward"] == 0.0


def test_verifiers_import_cli_and_sft_export(tmp_path):
    traces = write_jsonl(tmp_path / "traces.jsonl", EPISODE)
    assert cli_main(["traces", "import-verifiers", str(traces), "--store", str(tmp_path / "store"),
                     "--team", "team-a", "--model", "org/m"]) == 0
    export(tmp_path / "store", tmp_path / "sft", "sft", "team-a", progress=False)
    [row] = datasets.load_dataset("parquet", data_dir=str(tmp_path / "sft"))["train"]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(row["tools"]) == TOOLS

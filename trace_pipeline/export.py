"""Export one team's traces as training data: Parquet files that
`datasets.load_dataset("parquet", data_dir=out_dir)` loads.

    sft  one row per trajectory branch: TRL conversational `messages` + `tools` (JSON string)
    rl   one row per trajectory branch: token_ids, mask, logprobs, reward, advantage, ...
    raw  one row per record: every stored field, plus stitching and the joined rewards

Only sealed records are exported; by default export first seals what a dead writer
left in the WAL (recovery), so nothing acknowledged is missed after a crash.

The store is a directory (its sealed files under it) or a TraceStore, whose sealed files may be
in an S3-compatible object store (settings.sealed_uri): export reads them through it either way.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from trace_pipeline.rewards import JoinedReward, RewardBook
from trace_pipeline.stitching import Turn, assemble, chain, leaves, link_parents
from trace_pipeline.store import TraceStore
from trace_pipeline.tables import TRACE_SCHEMA
from trace_pipeline.verifiers_import import import_verifiers  # noqa: F401  (re-exported: part of the export API)

log = logging.getLogger(__name__)

FORMATS = ("sft", "rl", "raw")
ROWS_PER_FILE = 20_000

METRICS_TYPE = pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))
TOOL_CALL_TYPE = pa.struct([
    ("id", pa.string()), ("type", pa.string()),
    ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
])
MESSAGE_TYPE = pa.struct([
    ("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
    ("tool_call_id", pa.string()), ("name", pa.string()),
])
REWARD_FIELDS = [("reward", pa.float64()), ("advantage", pa.float64()), ("metrics", METRICS_TYPE)]
RL_SCHEMA = pa.schema([
    ("token_ids", pa.list_(pa.int64())), ("mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float64())), ("policy_versions", pa.list_(pa.int64())),  # -1 on prompt tokens
    ("reward", pa.float64()), ("advantage", pa.float64()),
    ("policy_version", pa.int64()), ("session_id", pa.string()), ("request_id", pa.string()),
    ("choice_index", pa.int32()), ("trajectory_id", pa.string()), ("num_turns", pa.int32()),
    ("model", pa.string()), ("team", pa.string()), ("created_at", pa.float64()),
    ("metrics", METRICS_TYPE),
])
SFT_SCHEMA = pa.schema([
    ("messages", pa.list_(MESSAGE_TYPE)), ("tools", pa.string()),
    ("session_id", pa.string()), ("request_id", pa.string()), ("choice_index", pa.int32()),
    ("trajectory_id", pa.string()), ("model", pa.string()), ("policy_version", pa.int64()),
    ("reward", pa.float64()), ("advantage", pa.float64()),
])
RAW_SCHEMA = pa.schema(list(TRACE_SCHEMA) + [
    ("parent_request_id", pa.string()), ("parent_choice_index", pa.int32()),
    ("trajectory_id", pa.string()), ("is_leaf", pa.bool_()), *REWARD_FIELDS,
])


def export(store: TraceStore | Path | str, out_dir: Path | str, fmt: str, team: str, *,
           since: float | None = None, until: float | None = None, model: str | None = None,
           policy_version: int | None = None, session_id: str | None = None,
           progress: bool = True, recover: bool = True) -> int:
    """Writes team's matching traces to out_dir/part-NNNNN.parquet; returns rows written.

    Filters: created_at in [since, until) (unix seconds), model, policy_version, session_id.
    A trajectory whose turns fall partly outside the filters is stitched from the turns inside.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    if not isinstance(store, TraceStore):
        if not Path(store).is_dir():
            raise FileNotFoundError(f"no trace store at {store}")
        store = TraceStore(store)
    if out_dir.exists() and any(out_dir.glob("*.parquet")):
        raise FileExistsError(f"{out_dir} already holds Parquet files; export into an empty directory")
    if recover:
        store.recover()
    table = store.read_table(team, since=since, until=until, model=model,
                             policy_version=policy_version, session_id=session_id,
                             columns=INPUT_COLUMNS[fmt])
    table = table.take(pc.sort_indices(table, sort_keys=[
        ("session_id", "ascending"), ("created_at", "ascending"),
        ("request_id", "ascending"), ("choice_index", "ascending")]))
    records = Columns(table)
    rewards = RewardBook(store.read_rewards(team))
    with tqdm(total=table.num_rows, unit="rec", desc=f"export {fmt}", disable=not progress) as bar:
        forest = stitch(records, bar)
    build = {"sft": sft_table, "rl": rl_table, "raw": raw_table}[fmt]
    result = build(records, forest, rewards)
    write_parts(result, out_dir)
    log.info("exported %d %s rows from %d records of team %s to %s",
             result.num_rows, fmt, table.num_rows, team, out_dir)
    return result.num_rows


SCALAR_COLUMNS = ["request_id", "choice_index", "session_id", "team", "model", "policy_version",
                  "created_at"]
TOKEN_COLUMNS = ["prompt_token_ids", "completion_token_ids", "completion_logprobs", "completion_mask",
                 "completion_policy_versions"]
STITCH_COLUMNS = SCALAR_COLUMNS + TOKEN_COLUMNS
CHAT_COLUMNS = ["request_messages", "tools", "output_message", "output_text"]
INPUT_COLUMNS = {"rl": STITCH_COLUMNS, "sft": STITCH_COLUMNS + CHAT_COLUMNS, "raw": TRACE_SCHEMA.names}


class Columns:
    """The sorted records, as Python lists and zero-copy numpy views of the token lists."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.n = table.num_rows
        for name in SCALAR_COLUMNS + CHAT_COLUMNS:
            setattr(self, name, table[name].to_pylist() if name in table.column_names else None)
        self.prompt = list_views(table["prompt_token_ids"])
        self.completion = list_views(table["completion_token_ids"])
        self.logprobs = list_views(table["completion_logprobs"])
        self.mask = list_views(table["completion_mask"])
        self.versions = list_views(table["completion_policy_versions"])

    def turn(self, i: int) -> Turn:
        versions = self.versions[i]
        if versions is None:  # every token sampled by the record's policy version
            versions = np.full(len(self.completion[i]), self.policy_version[i], dtype=np.int64)
        return Turn(self.prompt[i], self.completion[i], self.logprobs[i], self.mask[i], versions)

    def key(self, i: int) -> tuple[str, int]:
        return self.request_id[i], self.choice_index[i]


def list_views(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(array) == 0:
        return []
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    return [None if nulls[i] else values[offsets[i]:offsets[i + 1]] for i in range(len(array))]


@dataclass
class Forest:
    parents: list[int | None]      # row index of the turn each row continues
    roots: list[int]               # row index of each row's trajectory root
    leaves: list[int]              # rows that end a branch


def stitch(records: Columns, bar: tqdm) -> Forest:
    parents: list[int | None] = [None] * records.n
    for rows in session_runs(records.session_id):
        for local, parent in enumerate(link_parents([records.turn(i) for i in rows])):
            parents[rows[local]] = None if parent is None else rows[parent]
        bar.update(len(rows))
    roots = [chain(parents, i)[0] for i in range(records.n)]
    return Forest(parents, roots, leaves(parents))


def session_runs(session_ids: list[str]) -> Iterator[list[int]]:
    """Row indices of each session (rows are sorted by session)."""
    start = 0
    for i in range(1, len(session_ids) + 1):
        if i == len(session_ids) or session_ids[i] != session_ids[start]:
            yield list(range(start, i))
            start = i


def joined_reward(records: Columns, forest: Forest, rewards: RewardBook, row: int) -> JoinedReward:
    path = chain(forest.parents, row)
    return rewards.join(records.session_id[row], [records.key(i) for i in path])


def metrics_rows(joined: JoinedReward) -> list[dict]:
    return [{"name": k, "value": float(v)} for k, v in sorted(joined.metrics.items())]


# ---- rl ---------------------------------------------------------------------------

def rl_table(records: Columns, forest: Forest, rewards: RewardBook) -> pa.Table:
    token_ids, masks, logprobs, versions, scalars = [], [], [], [], []
    for leaf in forest.leaves:
        path = chain(forest.parents, leaf)
        branch = assemble([records.turn(i) for i in path])
        joined = rewards.join(records.session_id[leaf], [records.key(i) for i in path])
        token_ids.append(branch.token_ids)
        masks.append(branch.mask)
        logprobs.append(branch.logprobs)
        versions.append(branch.policy_versions)
        scalars.append(dict(
            reward=joined.reward, advantage=joined.advantage,
            policy_version=records.policy_version[leaf], session_id=records.session_id[leaf],
            request_id=records.request_id[leaf], choice_index=records.choice_index[leaf],
            trajectory_id=records.request_id[path[0]], num_turns=len(path),
            model=records.model[leaf], team=records.team[leaf],
            created_at=records.created_at[leaf], metrics=metrics_rows(joined)))
    columns = {name: [row[name] for row in scalars] for name in RL_SCHEMA.names if name not in
               ("token_ids", "mask", "logprobs", "policy_versions")}
    columns["token_ids"] = list_array(token_ids, pa.int64())
    columns["mask"] = list_array(masks, pa.int8())
    columns["logprobs"] = list_array(logprobs, pa.float64())
    columns["policy_versions"] = list_array(versions, pa.int64())
    return pa.Table.from_pydict({name: columns[name] for name in RL_SCHEMA.names}, schema=RL_SCHEMA)


def list_array(parts: list[np.ndarray], value_type: pa.DataType) -> pa.Array:
    """One list<value_type> array from numpy arrays, without going through Python lists."""
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))


# ---- sft --------------------------------------------------------------------------

def sft_table(records: Columns, forest: Forest, rewards: RewardBook) -> pa.Table:
    rows, skipped = [], 0
    for leaf in forest.leaves:
        if records.request_messages[leaf] is None:
            skipped += 1      # completions / generate endpoints carry no conversation
            continue
        joined = joined_reward(records, forest, rewards, leaf)
        messages = [chat_message(m) for m in json.loads(records.request_messages[leaf])]
        messages.append(chat_message(assistant_output(records, leaf)))
        rows.append(dict(
            messages=messages, tools=records.tools[leaf], session_id=records.session_id[leaf],
            request_id=records.request_id[leaf], choice_index=records.choice_index[leaf],
            trajectory_id=records.request_id[forest.roots[leaf]], model=records.model[leaf],
            policy_version=records.policy_version[leaf], reward=joined.reward,
            advantage=joined.advantage))
    if skipped:
        log.info("sft export: skipped %d branch(es) without chat messages", skipped)
    return pa.Table.from_pylist(rows, schema=SFT_SCHEMA)


def assistant_output(records: Columns, row: int) -> dict:
    if records.output_message[row] is not None:
        return json.loads(records.output_message[row])
    return {"role": "assistant", "content": records.output_text[row] or ""}


def chat_message(message: dict) -> dict:
    """An OpenAI chat message in the fixed shape of MESSAGE_TYPE."""
    return {
        "role": message.get("role"),
        "content": text_content(message.get("content")),
        "tool_calls": [tool_call(c) for c in message["tool_calls"]] if message.get("tool_calls") else None,
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
    }


def text_content(content) -> str | None:
    """Content parts (OpenAI list form) become their text joined; other parts are dropped."""
    if content is None or isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def tool_call(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": call.get("id"), "type": call.get("type", "function"),
            "function": {"name": function.get("name"), "arguments": arguments}}


# ---- raw --------------------------------------------------------------------------

def raw_table(records: Columns, forest: Forest, rewards: RewardBook) -> pa.Table:
    joined = [joined_reward(records, forest, rewards, i) for i in range(records.n)]
    parents = forest.parents
    extra = {
        "parent_request_id": [None if p is None else records.request_id[p] for p in parents],
        "parent_choice_index": [None if p is None else records.choice_index[p] for p in parents],
        "trajectory_id": [records.request_id[r] for r in forest.roots],
        "is_leaf": [False] * records.n,
        "reward": [j.reward for j in joined],
        "advantage": [j.advantage for j in joined],
        "metrics": [metrics_rows(j) for j in joined],
    }
    for leaf in forest.leaves:
        extra["is_leaf"][leaf] = True
    table = records.table
    for field in RAW_SCHEMA:
        if field.name in extra:
            table = table.append_column(field, pa.array(extra[field.name], type=field.type))
    return table


def write_parts(table: pa.Table, out_dir: Path) -> None:
    """part-00000.parquet, ... . Nothing for an empty export: HF datasets cannot load a
    Parquet file without rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if table.num_rows == 0:
        log.warning("export: no trace matched; no file written to %s", out_dir)
    for part, start in enumerate(range(0, table.num_rows, ROWS_PER_FILE)):
        pq.write_table(table.slice(start, ROWS_PER_FILE), out_dir / f"part-{part:05d}.parquet",
                       compression="zstd")

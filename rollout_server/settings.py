"""Every option of rollout-serve, as one typed tree: a section per package that reads it.

    Settings
    ├── server   ServerSettings    the front door: address, keys, request limits (this module)
    ├── state    StateSettings     where models, logs and databases live (this module)
    ├── engine   EngineSettings    model, workers, routing, disaggregation, pools, LoRA, KV tier (engine/settings.py)
    ├── traces   TraceSettings     trace capture and store (trace_pipeline/settings.py)
    ├── deploy   DeploySettings    checkpoint deploys (finetune_deploy/settings.py)
    └── usage, quotas, batches,    accounting, rate limits, the Batch API,
        limits                     what one request may ask (this module)

Names, the same on the command line, in the environment and as keyword arguments:
- a field of `server`, `state`, `engine` and engine's sections other than `kv_tier` goes by its own name:
  `--workers 2`, ROLLOUT_SERVE_WORKERS=2, Settings(workers=2);
- a field of the other sections goes by section and name: `--traces-enabled`, ROLLOUT_SERVE_TRACES__ENABLED;
- the full path always works in the environment: ROLLOUT_SERVE_ENGINE__WORKERS, ROLLOUT_SERVE_ENGINE__KV_TIER__ENABLED.
Those rules are `SETTINGS_NAMES`, built from the tree: no name is listed by hand.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from engine.settings import EngineSettings
from finetune_deploy.settings import DeploySettings
from trace_pipeline.settings import TraceSettings

ENV_PREFIX = "ROLLOUT_SERVE_"


def _home_cache() -> Path:
    return Path.home() / ".cache" / "rollout-serve"


class ServerSettings(BaseModel):
    host: str = Field("127.0.0.1", description="address the front door listens on")
    port: int = Field(8000, description="port of the OpenAI-compatible front door")
    admin_key: str | None = Field(None, description="API key with admin rights (deployments, weight updates)")
    open_mode: bool = Field(False, description="serve callers without a key as the local admin (team 'local'), "
                                               "from loopback clients only, and only with a loopback --host; off "
                                               "by default so that no key, a wrong database_url or every key "
                                               "revoked never opens the service (docs/security.md)")
    max_connections: int = Field(2048, ge=1, description="connections served at once (a request over it: 503); "
                                                         "bounds the sockets and tasks one client can hold, with "
                                                         "room for thousands of concurrent rollout streams")
    body_timeout_s: float = Field(60.0, gt=0, description="seconds a request's body may take to arrive, from its "
                                                          "headers to its last byte (408 and the connection closed "
                                                          "after): a slow or stalled body cannot hold a connection; "
                                                          "a full 200 MiB batch file needs ~3.5 MB/s")
    headers_timeout_s: float = Field(30.0, gt=0, description="seconds a connection's request headers may take to "
                                                             "arrive (from its opening, or a later request's first "
                                                             "byte) before the connection is closed: idle or "
                                                             "trickling connections cannot fill max_connections")
    keep_alive_timeout_s: float = Field(
        75.0, gt=0,
        description="seconds an idle connection is kept open between requests. Longer than clients keep idle "
                    "connections in their pools (httpx 5 s, aiohttp 15 s): a server that closes one first races "
                    "the client's next request on it, which fails without an answer (uvicorn's 5 s default did, "
                    "under verifiers' rollouts)")
    keys_recheck_s: float = Field(2.0, ge=0, description="how long the server trusts what it last read of a key "
                                                      "(or of whether any key exists): keys created or revoked with "
                                                      "`rollout-serve keys` take effect within this delay")
    max_request_body_mib: float = Field(32.0, gt=0, description="largest JSON request body accepted (413 above it); a "
                                        "1M-token prompt is ~4 MiB as text, ~7 MiB as token ids")
    default_max_tokens: int | None = Field(None, description="max_tokens when a chat request sets none (None: fill "
                                                             "the context, as vLLM)")
    tool_call_retries: int = Field(
        2, ge=0, le=8,
        description="times a tool call whose arguments break a schema keyword the grammar cannot enforce "
                    "(uniqueItems, oneOf, ...: docs/tool_calls.md) is sampled again from just before it; "
                    "0: such a call ends its choice with finish_reason 'error'")
    session_prompt_tokens: int = Field(
        4_000_000, ge=0,
        description="token ids of named sessions' chat prompts the front door keeps (with their text: ~8 bytes a "
                    "token for ASCII text, up to ~20 otherwise), so that a returning turn tokenizes only what it "
                    "adds; 0: every prompt is tokenized whole")
    kv_share_groups: list[list[str]] = Field(
        default_factory=list,
        description="teams that share cached KV (prefix cache, KV router, KV tier), as groups: "
                    '[["rl", "eval"]] lets rl and eval reuse each other\'s cached prompts; every other team\'s KV is '
                    "its own, so no team can learn from cached_tokens what another sent (rollout_server/serving/"
                    "team_scope.py); a team in at most one group; JSON on the command line and in the environment")
    kv_salt_secret: str | None = Field(
        None, description="secret that keys each team's KV cache salt, so that salts cannot be computed from team "
                          "names; None: a random one per process (the caches it salts live as long as the stack it "
                          "starts); set the same value on front doors that share workers")

    @field_validator("kv_share_groups", mode="before")
    @classmethod
    def _share_groups_as_json(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value  # a flag's value is text

    @field_validator("kv_share_groups")
    @classmethod
    def _team_in_one_group(cls, groups: list[list[str]]) -> list[list[str]]:
        teams = [team for group in groups for team in set(group)]
        if len(teams) != len(set(teams)):
            raise ValueError("a team may be in at most one of kv_share_groups")
        return groups


class StateSettings(BaseModel):
    cache_dir: Path = Field(default_factory=_home_cache, description="models and compiled artefacts")
    state_dir: Path | None = Field(None, description="run-time state: logs, discovery files, database (default: "
                                                     "cache_dir/state)")
    database_url: str | None = Field(
        None, description="the database of keys, usage, rate limits and the deploy registry: sqlite:///PATH or "
                          "postgresql://USER:PASSWORD@HOST:PORT/NAME (rollout_server/database.py; default: SQLite in "
                          "state_dir)")

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str | None) -> str | None:
        return _supported_database_url(url)

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir or self.cache_dir / "state"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_state_dir / 'rollout-serve.db'}"

    def under_state(self, path: Path) -> Path:
        """`path` as given when absolute, else under the state directory."""
        return path if path.is_absolute() else self.resolved_state_dir / path


class UsageSettings(BaseModel):
    enabled: bool = Field(True, description="count every request's tokens per key, team and model (rollout_server/usage.py)")
    flush_every_s: float = Field(1.0, gt=0, description="how often the aggregated counts are written (the most a "
                                                        "killed process loses)")


class QuotaSettings(BaseModel):
    """Defaults for keys with no row (or a NULL column) in key_limits (rollout_server/quotas.py)."""

    requests_per_min: int | None = Field(None, ge=1, description="requests per minute per key (None: no limit)")
    tokens_per_min: int | None = Field(None, ge=1, description="prompt + completion tokens per minute per key "
                                                               "(None: no limit)")
    limits_cache_s: float = Field(10.0, ge=0, description="how long a key's limits are cached before key_limits "
                                                          "is read again")


class BatchSettings(BaseModel):
    enabled: bool = Field(True, description="serve the Batch API (rollout_server/batches.py)")
    dir: Path = Field(Path("batches"), description="batch files (relative: under the state dir)")
    database_url: str | None = Field(None, description="batch records: sqlite:///PATH or postgresql://... as "
                                                       "state's database_url (default: SQLite <dir>/batches.db)")
    max_in_flight: int = Field(4, ge=1, description="batch lines running at once")
    max_file_bytes: int = Field(200 * 2**20, ge=1, description="largest input file accepted")
    max_lines: int = Field(50_000, ge=1, description="most lines in one input file")
    poll_s: float = Field(1.0, gt=0, description="the runner's idle re-check interval")
    yield_sleep_s: float = Field(0.5, gt=0, description="pause while interactive load asks batches to yield")
    # Retention (BatchStore.sweep, the same rules as the trace store's): on by default, so that no team can fill
    # the disk with files and none is kept forever by accident. A file an active batch uses is never removed.
    retention_days: float | None = Field(
        30.0, gt=0, description="days an input, output or error file is kept (by its created_at), then removed by "
                                "the retention sweep; None keeps them forever. 30: OpenAI's default for files of "
                                "purpose batch, so clients written for it fetch results in time")
    retention_bytes_per_team: int | None = Field(
        20 * 2**30, gt=0, description="bytes of files one team may hold (inputs, outputs and errors); over it the "
                                      "sweep removes that team's oldest files and no other team's. None: no cap. "
                                      "20 GiB: a hundred input files of the largest size (max_file_bytes), far from "
                                      "a shared disk's size")
    retention_sweep_s: float = Field(3600.0, gt=0, description="seconds between retention sweeps (the first runs "
                                                               "at start); hourly keeps the overshoot small")

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str | None) -> str | None:
        return _supported_database_url(url)


class LimitSettings(BaseModel):
    """What one request may ask of the front door (rollout_server/request_limits.py): each is a 400 naming the field
    when passed. The defaults are far above what any client of the tests, examples and benchmarks sends. And what
    the front door spends on grammars for all requests (rollout_server/tool_calls/grammar_cache.py)."""

    max_prompts: int = Field(2048, ge=1, description="prompts in one completions request (a list of texts or of "
                             "token-id lists); 2,048 as OpenAI's batched inputs, each prompt is an engine request")
    max_sampled_tokens: int = Field(2**20, ge=1, description="n x max_tokens of one generation, in tokens (an unset "
                                    "max_tokens counts as the room the context leaves); 1,048,576: 32 choices filling "
                                    "a 32k context, 8x an RL group of 16 x 8k")
    max_tools: int = Field(128, ge=0, description="tools in one request; 128 as OpenAI's limit and the largest "
                           "tool set of the benchmarks (each tool is rendered into the prompt and the grammar)")
    max_tool_schema_bytes: int = Field(64 * 2**10, ge=1, description="one tool's definition as compact JSON, in bytes; "
                                       "64 KiB: ~90x the largest schema of the benchmarks' suite (700 bytes); its "
                                       "grammar's compile time grows with it")
    max_session_id_chars: int = Field(256, ge=1, description="characters of a session id (X-Session-ID, the body's "
                                      "session_id or user, which name the session when no header does); 256 as a "
                                      "request id and as Dynamo's session header; ids are kept as pins and prompts")
    max_json_depth: int = Field(64, ge=1, description="nesting of a JSON request body, in levels of objects and "
                                "arrays; 64: the deepest body of the tests (a nested tool schema) is under 16, and "
                                "code that walks values recursively (validation, redaction) fails near 1,000")
    max_grammar_compiles: int = Field(2, ge=1, description="grammars (tool calls, structured outputs) checked and "
                                      "compiled at once, each in a thread of its own off the event loop; more wait "
                                      "their turn: 2 keeps a burst of distinct schemas to two cores of the front door "
                                      "and out of the threads tokenizing and database reads share")
    grammar_cache_mib: float = Field(64.0, gt=0, description="compiled grammars and checked schemas kept for reuse, "
                                     "in MiB (an entry's size: its text's length), least recently used evicted "
                                     "first; 64: hundreds of 128-tool grammars (~100-300 KB each)")


def _supported_database_url(url: str | None) -> str | None:
    """A database URL rollout_server/database.py opens (SQLite, PostgreSQL), else ValueError saying which do."""
    if url is None:
        return None
    from rollout_server.database import check_url  # SQLAlchemy (0.1 s) only when a URL is given

    return check_url(url)


# Sections whose fields go by section and name (their field names repeat across sections: enabled, dir, ...).
PREFIXED_SECTIONS = ("kv_tier", "traces", "usage", "quotas", "batches", "deploy", "limits")


@dataclass(frozen=True)
class SettingName:
    """One field of the tree: its path (("engine", "workers")) and its short name ("workers", "traces_enabled")."""

    path: tuple[str, ...]
    name: str
    field: Any  # pydantic FieldInfo

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore")

    server: ServerSettings = Field(default_factory=ServerSettings, description="the front door")
    state: StateSettings = Field(default_factory=StateSettings, description="state on disk")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="the engine")
    traces: TraceSettings = Field(default_factory=TraceSettings,
                                  description="trace capture and store (relative dir: under state_dir)")
    usage: UsageSettings = Field(default_factory=UsageSettings, description="usage accounting")
    quotas: QuotaSettings = Field(default_factory=QuotaSettings, description="default per-key rate limits")
    batches: BatchSettings = Field(default_factory=BatchSettings, description="Batch API")
    limits: LimitSettings = Field(default_factory=LimitSettings, description="what one request may ask")
    deploy: DeploySettings = Field(default_factory=DeploySettings,
                                   description="checkpoint deploys and RL weight sync")

    @model_validator(mode="before")
    @classmethod
    def _short_names(cls, data: Any) -> Any:
        """Keyword arguments by short name or section name, put where they belong in the tree."""
        return nest_short_names(data) if isinstance(data, dict) else data

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        # Full paths in the environment win over short names; keyword arguments win over both.
        return init_settings, env_settings, _ShortEnvNames(settings_cls), dotenv_settings, file_secret_settings

    @property
    def trace_dir(self) -> Path:
        return self.state.under_state(self.traces.dir)

    @property
    def batch_dir(self) -> Path:
        return self.state.under_state(self.batches.dir)

    @property
    def batch_database_url(self) -> str:
        return self.batches.database_url or f"sqlite:///{self.batch_dir / 'batches.db'}"


def _walk(model: type[BaseModel], path: tuple[str, ...] = ()):
    """(path, FieldInfo, is_section) of every field under `model`, depth first."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        yield path + (name,), field, section
        if section:
            yield from _walk(annotation, path + (name,))


def _short_name(path: tuple[str, ...]) -> str:
    prefixed = next((i for i, part in enumerate(path[:-1]) if part in PREFIXED_SECTIONS), None)
    return path[-1] if prefixed is None else "_".join(path[prefixed:])


SETTINGS_NAMES: list[SettingName] = [SettingName(path, _short_name(path), field)
                                     for path, field, section in _walk(Settings) if not section]
SECTIONS: dict[str, tuple[str, ...]] = {path[-1]: path for path, _, section in _walk(Settings) if section}
_BY_SHORT_NAME = {s.name: s.path for s in SETTINGS_NAMES}
assert len(_BY_SHORT_NAME) == len(SETTINGS_NAMES), "two settings share a short name"
assert not set(_BY_SHORT_NAME) & set(SECTIONS), "a setting's short name is also a section's"


def _put(tree: dict, path: tuple[str, ...], value: Any) -> None:
    """tree[path[0]]...[path[-1]] = value, making the sections on the way (a section given as a model is
    unfolded into its fields set)."""
    for part in path[:-1]:
        inner = tree.get(part)
        if isinstance(inner, BaseModel):
            inner = inner.model_dump(exclude_unset=True)
        tree[part] = inner if isinstance(inner, dict) else {}
        tree = tree[part]
    tree[path[-1]] = value


def nest_short_names(data: dict) -> dict:
    """{"workers": 2, "kv_tier": {...}} -> {"engine": {"workers": 2, "kv_tier": {...}}}; full paths stay."""
    nested = {k: v for k, v in data.items() if k in Settings.model_fields}
    for key, value in data.items():
        if key in Settings.model_fields:
            continue
        path = _BY_SHORT_NAME.get(key) or SECTIONS.get(key)
        if path is None:
            nested[key] = value  # ignored (extra="ignore"), as pydantic-settings ignores unknown fields
        else:
            _put(nested, path, value)
    return nested


class _ShortEnvNames(PydanticBaseSettingsSource):
    """ROLLOUT_SERVE_<SHORT NAME> and ROLLOUT_SERVE_<SECTION>__<FIELD>, read into the tree."""

    def get_field_value(self, field, field_name):  # noqa: ARG002 -- values come from __call__
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for key, value in os.environ.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX):].lower()
            section, _, rest = name.partition("__")
            if rest and section in SECTIONS and SECTIONS[section] != (section,):
                _put(tree, SECTIONS[section] + tuple(rest.split("__")), value)
            elif not rest and name in _BY_SHORT_NAME and _BY_SHORT_NAME[name][-1] == name:
                _put(tree, _BY_SHORT_NAME[name], value)
        return tree

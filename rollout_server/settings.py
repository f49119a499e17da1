"""Every option of rollout-serve, as one typed tree: a section per package that reads it.

    Settings
    ├── server   ServerSettings    the front door: address, keys, request limits (this module)
    ├── state    StateSettings     where models, logs and databases live (this module)
    ├── engine   EngineSettings    model, workers, routing, disaggregation, pools, LoRA, KV tier (engine/settings.py)
    ├── traces   TraceSettings     trace capture and store (trace_pipeline/settings.py)
    ├── deploy   DeploySettings    checkpoint deploys (finetune_deploy/settings.py)
    └── usage, quotas, batches     accounting, rate limits, the Batch API (this module)

Names, the same on the command line, in the environment and as keyword arguments:
- a field of `server`, `state`, `engine` and engine's sections other than `kv_tier` goes by its own name:
  `--workers 2`, ROLLOUT_SERVE_WORKERS=2, Settings(workers=2);
- a field of the other sections goes by section and name: `--traces-enabled`, ROLLOUT_SERVE_TRACES__ENABLED;
- the full path always works in the environment: ROLLOUT_SERVE_ENGINE__WORKERS, ROLLOUT_SERVE_ENGINE__KV_TIER__ENABLED.
Those rules are `SETTINGS_NAMES`, built from the tree: no name is listed by hand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator
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


class StateSettings(BaseModel):
    cache_dir: Path = Field(default_factory=_home_cache, description="models and compiled artefacts")
    state_dir: Path | None = Field(None, description="run-time state: logs, discovery files, database (default: "
                                                     "cache_dir/state)")
    database_url: str | None = Field(None, description="SQLAlchemy URL for keys/usage (default: SQLite in state_dir)")

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
    database_url: str | None = Field(None, description="batch records (default: SQLite <dir>/batches.db)")
    max_in_flight: int = Field(4, ge=1, description="batch lines running at once")
    max_file_bytes: int = Field(200 * 2**20, ge=1, description="largest input file accepted")
    max_lines: int = Field(50_000, ge=1, description="most lines in one input file")
    poll_s: float = Field(1.0, gt=0, description="the runner's idle re-check interval")
    yield_sleep_s: float = Field(0.5, gt=0, description="pause while interactive load asks batches to yield")


# Sections whose fields go by section and name (their field names repeat across sections: enabled, dir, ...).
PREFIXED_SECTIONS = ("kv_tier", "traces", "usage", "quotas", "batches", "deploy")


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

"""Request bodies of the deploy endpoints, validated, and their errors in OpenAI's shape.

Three ways in, one meaning out (a WeightUpdate):
- POST /v1/admin/deployments  {"path", "pool", "as": "full"|"lora", "name"}    our admin API
- POST /update_weights        {"weight_dir"}                                  prime-rl's shape
- POST /v1/rl/update_weights  {"version", "target": {...}, "transport": {...}} Dynamo's RL API shape
  (transport "filesystem": a checkpoint's path; "gloo": the tensors a connected trainer broadcasts meanwhile)

Our admin API refuses unknown fields (a typo must not deploy with defaults);
the two borrowed shapes ignore them, as their own servers do.
Paths are server-side and must be absolute.
Each model's JSON schema (the OpenAPI document's) says what its validators require too (DocumentedModel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from engine.gloo_weights import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S, DTYPE_NAMES
from engine.weight_stamps import RunningKv
from finetune_deploy.checkpoint_files import CheckpointError
from finetune_deploy.checkpoints import detect_kind
from finetune_deploy.settings import InFlight
from finetune_deploy.weight_update import WeightUpdate
from rollout_server.errors import APIError, bad_request
from rollout_server.openapi import DocumentedModel

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"  # pool ids and served model ids


def require_absolute(path: str) -> str:
    if not Path(path).is_absolute():
        raise ValueError("must be an absolute path on the server")
    return path


# A path on the server, checked by require_absolute; the schema says it as a pattern
AbsolutePath = Annotated[str, Field(min_length=1, json_schema_extra={"pattern": "^/"}), AfterValidator(require_absolute)]


class DeploymentRequest(DocumentedModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    path: AbsolutePath
    pool: str | None = Field(None, pattern=NAME_PATTERN)  # None: the stack's pool
    as_: Literal["full", "lora"] | None = Field(None, alias="as")  # None: detected from the files
    name: str | None = Field(None, pattern=NAME_PATTERN)
    mode: Literal["rolling", "all_at_once"] | None = None  # full weights; None: the server's default
    in_flight: InFlight | None = None  # requests on a worker about to reload; None: the server's default
    wait: bool = False  # answer when the deploy is done, instead of at once (202) with its progress

    def weight_update(self) -> WeightUpdate:
        kind = self.as_ or _detected_kind(Path(self.path))
        return WeightUpdate(kind=kind, op="load", path=Path(self.path), name=self.name or Path(self.path).name,
                            pool=self.pool)


def _detected_kind(path: Path) -> str:
    """A path the server cannot look into (a name too long, no permission) is no adapter: registering it says why."""
    try:
        return detect_kind(path)
    except OSError:
        return "full"


class RollbackRequest(DocumentedModel):
    model_config = ConfigDict(extra="forbid")

    pool: str | None = Field(None, pattern=NAME_PATTERN)
    to_version: NonNegativeInt | None = None  # None: the version that served before the current one
    message: str = ""
    wait: bool = False


class PrimeUpdateWeightsRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    weight_dir: AbsolutePath

    def weight_update(self) -> WeightUpdate:
        return WeightUpdate(kind="full", op="load", path=Path(self.weight_dir))


class WeightTarget(DocumentedModel):
    model_config = ConfigDict(extra="ignore")
    schema_rules = ({"anyOf": [  # _op_fits_kind
        {"properties": {"kind": {"const": "base"}, "op": {"const": "load"}}},
        {"properties": {"kind": {"const": "lora"}, "name": {"type": "string"}}, "required": ["name"]},
    ]},)

    kind: Literal["base", "lora"]
    op: Literal["load", "swap", "unload"] = "load"
    name: str | None = Field(None, pattern=NAME_PATTERN)  # the adapter's served name; required for lora

    @model_validator(mode="after")
    def _op_fits_kind(self):
        if self.kind == "base" and self.op != "load":
            raise ValueError(f"a base target only supports op 'load' (full weights replace the old), not {self.op!r}")
        if self.kind == "lora" and not self.name:
            raise ValueError("a lora target needs a 'name': the adapter to load, swap or unload")
        return self


class FilesystemTransport(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    path: AbsolutePath


class GlooUpdate(DocumentedModel):
    """One round's tensors, in sending order (engine/gloo_weights.py GlooUpdateInfo): one entry per tensor in each
    list, the same number in all three (checked once a round runs)."""

    model_config = ConfigDict(extra="ignore")

    names: list[str]
    dtype_names: list[Literal[DTYPE_NAMES]]
    shapes: list[list[NonNegativeInt]]


class GlooInit(DocumentedModel):
    """How the workers join a trainer's gloo group (engine/gloo_weights.py GlooInitInfo); world_size is the
    trainer and every receiving rank (GET /v1/rl/weight_transfer/get_world_size, plus one)."""

    model_config = ConfigDict(extra="ignore")

    master_address: str = Field(min_length=1, max_length=255)
    master_port: int = Field(ge=1, le=65535)
    world_size: int = Field(ge=2, le=2**16)
    bucket_bytes: int = Field(DEFAULT_BUCKET_BYTES, ge=1, le=2**40)
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=3600)


class GlooTransport(DocumentedModel):
    """Weights broadcast by the trainer connected through /v1/rl/weight_transfer (rollout_server/routes/
    weight_transfer.py) while this request runs: start, one update of these tensors, finish as `version`."""

    model_config = ConfigDict(extra="ignore")

    update_info: GlooUpdate


class Transport(DocumentedModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra={  # _one_known
        "additionalProperties": False, "minProperties": 1, "maxProperties": 1})
    schema_rules = ({"properties": {"filesystem": {"type": "object"}, "gloo": {"type": "object"}}},)  # _one_known

    filesystem: FilesystemTransport | None = None
    gloo: GlooTransport | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_known(cls, data):
        # Other backends (nccl, ipc) are refused by name: ignoring them would report a missing filesystem block.
        keys = list(data) if isinstance(data, dict) else []
        unknown = [key for key in keys if key not in ("filesystem", "gloo")]
        if unknown:
            raise ValueError(f"transport {unknown[0]!r} is not supported here; 'filesystem' or 'gloo' (the CPU "
                             "path of a trainer's broadcast)")
        if len(keys) != 1 or data[keys[0]] is None:
            raise ValueError("name one transport: 'filesystem' or 'gloo', an object")
        return data


class RLUpdateWeightsRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")
    schema_rules = ({"anyOf": [  # _transport_unless_unload
        {"properties": {"transport": {"type": "object"}}, "required": ["transport"]},
        {"properties": {"target": {"properties": {"op": {"const": "unload"}}, "required": ["op"]}}},
    ]}, {"anyOf": [  # _transport_unless_unload: a broadcast carries full weights
        {"properties": {"transport": {"not": {"required": ["gloo"]}}}},
        {"properties": {"target": {"properties": {"kind": {"const": "base"}}}}},
    ]})

    version: NonNegativeInt  # our policy versions are integers; "12" is accepted as 12
    target: WeightTarget
    transport: Transport | None = Field(None, validate_default=True)
    in_flight: InFlight = "keep"  # RL: rollouts in flight go on under the new weights, each token stamped
    running_kv: RunningKv | None = None  # in_flight keep: their old-weights KV kept or recomputed; None: the default

    @field_validator("transport")
    @classmethod
    def _transport_unless_unload(cls, transport: Transport | None, info: ValidationInfo):
        # A field validator, not a model one, so that the 400 names 'transport'. `target` is validated first.
        target = info.data.get("target")
        if transport is None and target is not None and target.op != "unload":
            raise ValueError("transport.filesystem.path is required to load or swap weights")
        if transport is not None and transport.gloo is not None and target is not None and target.kind != "base":
            raise ValueError("a trainer's broadcast (gloo) carries full weights: target.kind must be 'base'")
        return transport

    @property
    def pushed(self) -> GlooTransport | None:
        """The tensors a connected trainer broadcasts during this request, if that is the transport."""
        return self.transport.gloo if self.transport else None

    def weight_update(self) -> WeightUpdate:
        path = Path(self.transport.filesystem.path) if self.transport and self.transport.filesystem else None
        kind = "full" if self.target.kind == "base" else "lora"
        return WeightUpdate(kind=kind, op=self.target.op, path=path, name=self.target.name, version=self.version)


Request = TypeVar("Request", bound=BaseModel)


def parse_request(model: type[Request], body: object) -> Request:
    """Validates a JSON body; the first problem becomes a 400 naming the field, as elsewhere in the API."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _request_error(exc.errors()[0]) from None


def _request_error(error: dict) -> APIError:
    # Not rollout_server.errors.validation_error: it drops any location part spelled "path",
    # which is a field name here.
    param = ".".join(str(part) for part in error.get("loc", ())) or None
    message = error.get("msg", "invalid value").removeprefix("Value error, ")
    if error.get("type") == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param=param, code="invalid_value")


def checkpoint_api_error(error: CheckpointError, param: str = "path") -> APIError:
    """A refused checkpoint: a well-formed request for files the server cannot serve (missing, incomplete, not
    fitting the base model), so a 409 naming the request field and the rule broken."""
    return APIError(409, f"Checkpoint refused ({error.field}): {error.message}", param=param,
                    code="invalid_checkpoint")

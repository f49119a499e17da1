"""The models the front door serves, and which policy version produced what.

A pool's base model is served under its own id; LoRA adapters deployed on it are
served under theirs, each listed with its parent. Full-weight deploys roll across
workers one at a time, so for a while workers run different versions: the table
keeps the version of each worker (by the Dynamo instance id the engine reports with
every response) and a response is stamped with the version of the worker that
produced it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rollout_server.errors import model_not_found


@dataclass(frozen=True)
class ServedModel:
    id: str                       # what clients send as `model` (and what Dynamo serves it as)
    policy_version: int
    parent: str | None = None     # an adapter's base model id
    path: str | None = None
    created: float = field(default_factory=time.time)


class ModelTable:
    def __init__(self, base_id: str, base_version: int, base_path: str):
        self.base = ServedModel(base_id, base_version, path=base_path)
        self.adapters: dict[str, ServedModel] = {}
        self._worker_versions: dict[str, int] = {}  # Dynamo instance id -> full-weights version it runs
        self._aborts: dict[str, list[float]] = {}    # Dynamo instance id -> when a deploy aborted its requests

    def resolve(self, model_id: str) -> ServedModel:
        """The served model a request names, or the OpenAI 404."""
        if model_id == self.base.id:
            return self.base
        if model_id in self.adapters:
            return self.adapters[model_id]
        raise model_not_found(model_id)

    def listing(self) -> list[ServedModel]:
        return [self.base, *self.adapters.values()]

    def version_served_by(self, model: ServedModel, worker_id: str | None) -> int:
        """The policy version that produced a response of `model` on worker `worker_id`."""
        if model.parent is not None:
            return model.policy_version  # the adapter's own version (its base weights are in its lineage)
        return self.version_of_worker(worker_id)

    def version_of_worker(self, worker_id: str | None) -> int:
        """The full-weights version a worker runs (mid-rollout, not every worker runs the pool's)."""
        return self._worker_versions.get(worker_id or "", self.base.policy_version)

    # ---- changes made by deploys ------------------------------------------------------

    def worker_switched(self, worker_id: str, version: int) -> None:
        """One worker now runs full-weights `version` (mid-rollout)."""
        self._worker_versions[worker_id] = version

    def base_switched(self, version: int, path: str) -> None:
        """Every worker runs full-weights `version`: the pool's policy."""
        self.base = ServedModel(self.base.id, version, path=path, created=self.base.created)
        self._worker_versions.clear()

    def worker_aborting(self, worker_id: str) -> None:
        """A deploy is about to abort the worker's in-flight requests (pause in abort mode)."""
        self._aborts.setdefault(worker_id, []).append(time.monotonic())

    def aborted_since(self, worker_id: str | None, since: float) -> bool:
        """Whether the worker's requests were aborted after `since` (time.monotonic()).

        vLLM reports an aborted request as finished and Dynamo passes it on as "stop", so
        the front door tells the two apart by the deploy's own record."""
        return any(at >= since for at in self._aborts.get(worker_id or "", ()))

    def adapter_loaded(self, name: str, version: int, path: str) -> None:
        self.adapters[name] = ServedModel(name, version, parent=self.base.id, path=path)

    def adapter_unloaded(self, name: str) -> None:
        self.adapters.pop(name, None)

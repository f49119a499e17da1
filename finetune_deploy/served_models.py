"""The models the front door serves, and which policy version produced what.

A pool's base model is served under its own id; LoRA adapters deployed on it are
served under theirs, each listed with its parent. Full-weight deploys roll across
workers one at a time, so for a while workers run different versions: the table
keeps the version of each worker (by the worker id the engine reports with every
response) and a response is stamped with the version of the worker that produced it.
The deployer (executor.py) writes the table; the front door reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.ids import PolicyVersion, WorkerId


@dataclass(frozen=True)
class ServedModel:
    id: str                       # what clients send as `model` (and what Dynamo serves it as)
    policy_version: PolicyVersion
    parent: str | None = None     # an adapter's base model id
    path: str | None = None
    created: float = field(default_factory=time.time)


class ModelTable:
    def __init__(self, base_id: str, base_version: PolicyVersion, base_path: str):
        self.base = ServedModel(base_id, base_version, path=base_path)
        self.adapters: dict[str, ServedModel] = {}
        self._worker_versions: dict[WorkerId, PolicyVersion] = {}  # the full-weights version each worker runs
        self._aborts: dict[WorkerId, list[float]] = {}              # when a deploy aborted a worker's requests

    def get(self, model_id: str) -> ServedModel | None:
        """The served model a request names (None: no such model)."""
        if model_id == self.base.id:
            return self.base
        return self.adapters.get(model_id)

    def listing(self) -> list[ServedModel]:
        return [self.base, *self.adapters.values()]

    def version_served_by(self, model: ServedModel, worker_id: WorkerId | None) -> PolicyVersion:
        """The policy version that produced a response of `model` on worker `worker_id`."""
        if model.parent is not None:
            return model.policy_version  # the adapter's own version (its base weights are in its lineage)
        return self.version_of_worker(worker_id)

    def version_of_worker(self, worker_id: WorkerId | None) -> PolicyVersion:
        """The full-weights version a worker runs (mid-rollout, not every worker runs the pool's)."""
        return self._worker_versions.get(worker_id, self.base.policy_version)

    def workers_at_least(self, model: ServedModel, version: PolicyVersion) -> frozenset[WorkerId] | None:
        """The workers that serve `model` at `version` or newer: None when every worker does (no restriction),
        an empty set when none does. Mid-rollout only the workers already switched serve the new version."""
        if model.parent is not None or self.base.policy_version >= version:
            return None if model.policy_version >= version else frozenset()
        return frozenset(worker for worker, v in self._worker_versions.items() if v >= version)

    # ---- changes made by deploys ------------------------------------------------------

    def worker_switched(self, worker_id: WorkerId, version: PolicyVersion) -> None:
        """One worker now runs full-weights `version` (mid-rollout)."""
        self._worker_versions[worker_id] = version

    def base_switched(self, version: PolicyVersion, path: str) -> None:
        """Every worker runs full-weights `version`: the pool's policy."""
        self.base = ServedModel(self.base.id, version, path=path, created=self.base.created)
        self._worker_versions.clear()

    def worker_aborting(self, worker_id: WorkerId) -> None:
        """A deploy is about to abort the worker's in-flight requests (pause in abort mode)."""
        self._aborts.setdefault(worker_id, []).append(time.monotonic())

    def aborted_since(self, worker_id: WorkerId | None, since: float) -> bool:
        """Whether the worker's requests were aborted after `since` (time.monotonic()).

        vLLM reports an aborted request as finished and Dynamo passes it on as "stop", so
        the front door tells the two apart by the deploy's own record."""
        return any(at >= since for at in self._aborts.get(worker_id, ()))

    def adapter_loaded(self, name: str, version: PolicyVersion, path: str) -> None:
        self.adapters[name] = ServedModel(name, version, parent=self.base.id, path=path)

    def adapter_unloaded(self, name: str) -> None:
        self.adapters.pop(name, None)

"""How a worker tells apart what different weights produced: the label on its tokens and the salt on its KV.

Shared by the supervisor (which starts a worker with its label), the deployer (which asks for an in-flight
update), the KV tier (which reads salts) and the worker (engine/worker/in_flight_updates.py applies the rules).

- Label: every token a worker samples is stamped with its engine's weight-version label, the policy version
  of its weights as decimal text. A worker starts labelled `VERSION_ENV`.
- Epoch salt: a worker's weights epoch counts its keep-mode pauses (each the start of an in-place weight
  update that leaves requests running, engine/worker/in_flight_updates.py). A request admitted in epoch e > 0
  has `#e` added to its cache salt (`salted`), so its blocks never match blocks hashed in another epoch; the KV
  tier, which keys by policy version itself, reads the salt without it (`user_salt`).
- Running KV: in an update that keeps requests running, what they do with the KV they computed under the old
  weights (`RunningKv`: keep it, or recompute it under the new weights).
"""

from __future__ import annotations

from typing import Literal

VERSION_ENV = "ROLLOUT_SERVE_WEIGHT_VERSION"
RunningKv = Literal["keep", "recompute"]
RUNNING_KV: tuple[RunningKv, ...] = ("keep", "recompute")
_EPOCH_MARK = "\x1frollout-serve-weights-epoch="


def salted(cache_salt: str | None, epoch: int) -> str | None:
    """The salt of a request admitted in `epoch` (epoch 0, the weights the worker started with: unchanged)."""
    return cache_salt if epoch == 0 else f"{cache_salt or ''}{_EPOCH_MARK}{epoch}"


def user_salt(cache_salt: str | None) -> str:
    """A request's salt without its epoch (what the KV tier keys by)."""
    return (cache_salt or "").split(_EPOCH_MARK, 1)[0]

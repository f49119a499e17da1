"""What every request needs, built once by the app (rollout_server/server.py) and shared by all requests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Coroutine

from engine.ids import DEFAULT_POOL
from engine.supervisor.pool_config import PoolConfig
from finetune_deploy.served_models import ModelTable
from rollout_server.auth import Principal
from rollout_server.metrics import Metrics
from rollout_server.pool_access import Target, target
from rollout_server.quotas import RateLimiter
from rollout_server.serving.finished import FinishHook
from rollout_server.serving.team_scope import TeamScope
from rollout_server.settings import Settings
from rollout_server.tokenizer import ModelTokenizer
from rollout_server.tool_calls import GrammarCache, ToolCallFormat

if TYPE_CHECKING:
    from engine.client.dispatch import Dispatcher


@dataclass
class ServingContext:
    settings: Settings
    tokenizer: ModelTokenizer
    client: Dispatcher                            # a request -> a healthy deployment of its pool
    metrics: Metrics
    models: ModelTable                            # the base model, LoRA adapters, each worker's policy version
    max_model_len: int
    on_finish: list[FinishHook] = field(default_factory=list)
    tool_format: ToolCallFormat | None = None     # from the chat template; None: the model cannot call tools
    grammars: GrammarCache = None                 # type: ignore[assignment]  # None: made from settings.limits
    limiter: RateLimiter | None = None            # per-key requests/min and tokens/min
    pools: dict[str, PoolConfig] = field(  # name -> config, the default pool included
        default_factory=lambda: {DEFAULT_POOL: PoolConfig(name=DEFAULT_POOL, kind="shared")})

    teams: TeamScope = field(init=False)          # each team's KV salt, its sessions and request ids (team_scope.py)

    _wrapping_up: set[asyncio.Task] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.grammars is None:
            limits = self.settings.limits
            self.grammars = GrammarCache(budget_bytes=int(limits.grammar_cache_mib * 2**20),
                                         max_compiles=limits.max_grammar_compiles)
        self.teams = TeamScope.from_settings(self.settings.server)

    @property
    def model_name(self) -> str:
        return self.models.base.id

    def target(self, model_field: str, who: Principal) -> Target:
        """The served model and pool a request's `model` names (404 unknown, 403 another team's pool)."""
        return target(model_field, who, self.pools, self.models)

    def after_answer(self, wrap_up: Coroutine[Any, Any, None]) -> None:
        """Runs a request's wrap-up in a task of its own: it starts once the request's task has answered."""
        task = asyncio.get_running_loop().create_task(wrap_up)
        self._wrapping_up.add(task)
        task.add_done_callback(self._wrapping_up.discard)

    async def wrapped_up(self) -> None:
        """Waits for the wrap-ups still running (at shutdown, before the stores their hooks write to close)."""
        while self._wrapping_up:
            await asyncio.gather(*self._wrapping_up, return_exceptions=True)

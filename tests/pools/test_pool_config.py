"""The pools file and who may use which pool (no stack needed)."""

import pytest

from engine.ids import DEFAULT_POOL
from engine.supervisor.pool_config import PoolConfig, PoolFileError, load_pools, pool_ports
from finetune_deploy.served_models import ModelTable
from rollout_server.auth import Principal
from rollout_server.errors import APIError
from rollout_server.pool_access import reachable_pools, target

POOLS = """
[pools.team-a]
kind = "reserved"
team = "team-a"
workers = 2

[pools.burst]
kind = "serverless"
max_workers = 3
idle_s = 30
"""


def write(tmp_path, text: str):
    path = tmp_path / "pools.toml"
    path.write_text(text)
    return path


def test_a_pools_file_declares_reserved_and_serverless_pools(tmp_path):
    reserved, serverless = load_pools(write(tmp_path, POOLS))
    assert (reserved.name, reserved.kind, reserved.team, reserved.initial_workers) == ("team-a", "reserved", "team-a", 2)
    assert (serverless.name, serverless.min_workers, serverless.max_workers, serverless.idle_s) == ("burst", 0, 3, 30)
    assert serverless.initial_workers == 0


@pytest.mark.parametrize("text, named", [
    ('[pools.x]\nkind = "reserved"\n', "pools.x: Value error, a reserved pool needs `team`"),
    ('[pools.x]\nkind = "serverless"\nmin_workers = 3\nmax_workers = 1\n', "min_workers must not exceed max_workers"),
    ('[pools.x]\nkind = "dedicated"\n', "pools.x.kind"),
    ('[pools.x]\nkind = "serverless"\nidle_s = -1\n', "pools.x.idle_s"),
    ('[pools.x]\nkind = "serverless"\nmax_worker = 2\n', "pools.x.max_worker"),
    ('[pools.default]\nkind = "serverless"\n', "`default` is the stack's own pool"),
    ('[pool.x]\nkind = "serverless"\n', "unknown section(s) ['pool']"),
    ('[pools.x\n', "pools file"),
])
def test_a_bad_pools_file_names_the_field(tmp_path, text, named):
    with pytest.raises(PoolFileError) as bad:
        load_pools(write(tmp_path, text))
    assert named in str(bad.value) and "pools.toml" in str(bad.value)


def test_each_deployment_gets_its_own_port_block():
    first, second = pool_ports(21000, 0), pool_ports(21000, 1)
    assert first == {"frontend_port": 21000, "worker_system_base_port": 21001, "kv_events_base_port": 21021}
    assert second["frontend_port"] == 21040


CONFIGS = {DEFAULT_POOL: PoolConfig(name=DEFAULT_POOL, kind="shared"),
           "team-a": PoolConfig(name="team-a", kind="reserved", team="team-a"),
           "burst": PoolConfig(name="burst", kind="serverless")}
MODELS = ModelTable("tiny", 0, "/models/tiny")


def who(team: str, admin: bool = False) -> Principal:
    return Principal(team, "rs-abc", is_admin=admin)


def test_a_team_is_served_by_its_reserved_pool_and_others_by_the_default_pool():
    assert target("tiny", who("team-a"), CONFIGS, MODELS).pool == "team-a"
    assert target("tiny", who("team-b"), CONFIGS, MODELS).pool == DEFAULT_POOL
    assert target("tiny@burst", who("team-b"), CONFIGS, MODELS) == target("tiny@burst", who("team-a"), CONFIGS, MODELS)
    assert target("tiny@burst", who("team-b"), CONFIGS, MODELS).model.id == "tiny"


def test_another_teams_reserved_pool_is_403_and_unknown_pools_or_models_404():
    with pytest.raises(APIError) as refused:
        target("tiny@team-a", who("team-b"), CONFIGS, MODELS)
    assert (refused.value.status, refused.value.param, refused.value.code) == (403, "model", "pool_reserved")
    assert target("tiny@team-a", who("ops", admin=True), CONFIGS, MODELS).pool == "team-a"
    for model in ("tiny@nowhere", "other@burst"):
        with pytest.raises(APIError) as missing:
            target(model, who("team-a"), CONFIGS, MODELS)
        assert missing.value.status == 404 and missing.value.param == "model"


def test_a_team_sees_the_pools_it_may_use():
    assert reachable_pools(who("team-a"), CONFIGS) == ["team-a", "burst"]
    assert reachable_pools(who("team-b"), CONFIGS) == ["burst"]

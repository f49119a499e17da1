import pytest

from rollout_server.tool_calls import format_by_name


@pytest.fixture(params=["hermes", "xml_params"])
def fmt(request):
    return format_by_name(request.param)

"""benchmarks/tool_schemas.py: the suite is valid, and every tool round-trips through the
grammar and the parser in both formats."""

import json

import jsonschema
import pytest
from tool_call_helpers import RENDERERS, example_arguments, grammar_accepts, tool_schemas_module

from rollout_server.tool_calls import validate_tool_request

schemas = tool_schemas_module()


def test_suite_has_at_least_50_valid_distinct_tools():
    assert len(schemas.TOOL_SUITE) >= 50
    assert len(set(schemas.TOOL_NAMES)) == len(schemas.TOOL_NAMES)
    validate_tool_request(schemas.TOOL_SUITE, "required", True)


def test_suite_covers_the_schema_features_agents_use():
    text = json.dumps(schemas.TOOL_SUITE)
    for feature in ('"enum"', '"type": "array"', '"additionalProperties"', '"minimum"', '["integer", "null"]', '"format"'):
        assert feature in text, feature
    nested = [t for t in schemas.TOOL_SUITE if '"type": "object"' in json.dumps(t["function"]["parameters"]["properties"])]
    optional = [t for t in schemas.TOOL_SUITE if set(t["function"]["parameters"]["properties"]) - set(t["function"]["parameters"]["required"])]
    assert len(nested) >= 5 and len(optional) >= 30


@pytest.mark.parametrize("count", [1, 16, 50, 128])
def test_generator_gives_distinct_names(count):
    tools = schemas.tools_for_request(count)
    assert len(tools) == count == len({t["function"]["name"] for t in tools})
    validate_tool_request(tools, "auto", True)
    assert schemas.tools_for_request(count) == tools  # deterministic


@pytest.mark.parametrize("count", [0, 129])
def test_generator_bounds(count):
    with pytest.raises(ValueError):
        schemas.tools_for_request(count)


def test_every_suite_tool_round_trips(fmt):
    tag = fmt.structural_tag(schemas.TOOL_SUITE, "auto", True)
    for tool in schemas.TOOL_SUITE:
        name, parameters = tool["function"]["name"], tool["function"]["parameters"]
        arguments = example_arguments(parameters)
        jsonschema.validate(arguments, parameters)
        text = "Calling " + name + ".\n" + RENDERERS[fmt.name](name, arguments)
        assert grammar_accepts(tag, text), name
        parsed = fmt.parse(text, schemas.TOOL_SUITE)
        assert parsed.tool_calls[0]["function"]["name"] == name
        assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == arguments, name

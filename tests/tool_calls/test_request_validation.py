import pytest
from tool_call_helpers import function_tool

from rollout_server.tool_calls import ToolRequestError, validate_tool_request

READ = function_tool("read_file", {"path": {"type": "string"}}, ["path"])
NAMED_READ = {"type": "function", "function": {"name": "read_file"}}


@pytest.mark.parametrize("choice", [None, "none", "auto", "required", NAMED_READ])
@pytest.mark.parametrize("parallel", [None, True, False])
def test_valid_requests_pass(choice, parallel):
    validate_tool_request([READ], choice, parallel)


def test_no_tools_is_fine_for_auto_and_none():
    validate_tool_request(None, "auto", None)
    validate_tool_request([], "none", None)


def test_function_without_parameters_is_valid():
    validate_tool_request([{"type": "function", "function": {"name": "ping"}}], "required", None)


def reason(tools, choice="auto", parallel=None) -> ToolRequestError:
    with pytest.raises(ToolRequestError) as caught:
        validate_tool_request(tools, choice, parallel)
    return caught.value


def test_named_tool_must_exist():
    error = reason([READ], {"type": "function", "function": {"name": "write_file"}})
    assert error.param == "tool_choice" and "write_file" in error.message


@pytest.mark.parametrize("choice", ["required", NAMED_READ])
def test_forcing_a_call_needs_tools(choice):
    assert reason(None, choice).param == "tool_choice"
    assert reason([], choice).param == "tool_choice"


@pytest.mark.parametrize("choice", ["any", "", {"type": "function"}, {"type": "function", "function": {}}, 3])
def test_unknown_tool_choice(choice):
    assert reason([READ], choice).param == "tool_choice"


def test_parallel_must_be_boolean():
    assert reason([READ], "auto", "yes").param == "parallel_tool_calls"


def test_tools_must_be_a_list_of_functions():
    assert reason({"type": "function"}).param == "tools"
    assert reason([{"type": "code_interpreter"}]).param == "tools[0]"
    assert reason([READ, {"type": "function", "function": "x"}]).param == "tools[1].function"


@pytest.mark.parametrize("name", ["", "has space", "dots.not.allowed", "x" * 65, "<function=x>", None])
def test_function_names_follow_openai_rules(name):
    assert reason([{"type": "function", "function": {"name": name}}]).param == "tools[0].function.name"


def test_duplicate_names():
    assert reason([READ, READ]).param == "tools[1].function.name"


@pytest.mark.parametrize(
    "parameters",
    [
        "a string",
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {"path": {"type": "strin"}}},
        {"type": "object", "required": "path"},
    ],
)
def test_invalid_parameter_schemas(parameters):
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    assert reason([tool]).param == "tools[0].function.parameters"

"""What a request asks for: its function tools, its tool_choice, parallel_tool_calls.

`validate_tool_request` rejects bad input with a `ToolRequestError` that names the
offending parameter, so the front door can answer 400 before anything is compiled.
`read_tool_request` turns valid input into the small dataclasses the formats use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

# OpenAI's rule for function names. It also keeps names safe inside the tags
# (`<function=NAME>`, `"name": "NAME"`) without any escaping.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# OpenAI: a function without `parameters` takes an empty parameter list.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class ToolRequestError(ValueError):
    """A client error in tools / tool_choice / parallel_tool_calls (answer 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class FunctionTool:
    name: str
    parameters: dict[str, Any]  # a JSON Schema for the arguments object


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None  # the forced function when mode == "named"


def validate_tool_request(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> None:
    """Raises ToolRequestError unless the three fields form a valid request."""
    function_tools = _read_tools(tools, check_schemas=True)
    choice = _read_choice(tool_choice)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolRequestError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if choice.mode in ("required", "named") and not function_tools:
        raise ToolRequestError(f"tool_choice {_describe(choice)} needs at least one tool in `tools`", "tool_choice")
    if choice.mode == "named" and choice.name not in {tool.name for tool in function_tools}:
        raise ToolRequestError(f"tool_choice names function '{choice.name}', which is not in `tools`", "tool_choice")


def read_tool_request(tools: Any, tool_choice: Any) -> tuple[list[FunctionTool], ToolChoice]:
    """The tools and choice as dataclasses. Cheap: the schemas are not checked again,
    so call validate_tool_request first."""
    return _read_tools(tools, check_schemas=False), _read_choice(tool_choice)


def _read_tools(tools: Any, check_schemas: bool) -> list[FunctionTool]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolRequestError("tools must be a list", "tools")
    function_tools = [_read_tool(tool, f"tools[{i}]", check_schemas) for i, tool in enumerate(tools)]
    seen: set[str] = set()
    for i, tool in enumerate(function_tools):
        if tool.name in seen:
            raise ToolRequestError(f"function name '{tool.name}' appears twice in tools", f"tools[{i}].function.name")
        seen.add(tool.name)
    return function_tools


def _read_tool(tool: Any, where: str, check_schema: bool) -> FunctionTool:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolRequestError('each tool must be {"type": "function", "function": {...}}', where)
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ToolRequestError("tool.function must be an object", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ToolRequestError(
            f"function name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, _ or -", f"{where}.function.name"
        )
    parameters = function.get("parameters")
    if parameters is None:
        return FunctionTool(name, NO_PARAMETERS)
    if check_schema:
        _check_parameters_schema(parameters, f"{where}.function.parameters")
    return FunctionTool(name, parameters)


def _check_parameters_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ToolRequestError("parameters must be a JSON Schema object", where)
    if schema.get("type", "object") != "object":
        raise ToolRequestError('parameters must describe an object ("type": "object")', where)
    if problem := json_schema_problem(schema):
        raise ToolRequestError(f"parameters is not a valid JSON Schema: {problem}", where)


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` breaks the rules of its JSON Schema dialect (its $schema, else 2020-12), or None."""
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as error:
        return error.message
    return None


def _read_choice(tool_choice: Any) -> ToolChoice:
    if tool_choice is None:
        return ToolChoice("auto")
    if tool_choice in ("none", "auto", "required"):
        return ToolChoice(tool_choice)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return ToolChoice("named", function["name"])
    raise ToolRequestError(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def _describe(choice: ToolChoice) -> str:
    return f"naming '{choice.name}'" if choice.mode == "named" else f'"{choice.mode}"'

"""A fixed suite of realistic tool schemas, and tool sets of 1..128 tools built from it.

The suite covers what agents send: file edits, shell, search, git, HTTP, nested
objects, enums, arrays, maps, optional and required fields, nullable values. It is
data for the tool-call tests and benchmarks (`tools_for_request(n)`), plus a
compile-time micro-benchmark of our structural tags with xgrammar's real compiler:

    python benchmarks/tool_schemas.py [TOKENIZER_DIR]    # default: the tiny model
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any


def string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def integer(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": description, **extra}


def number(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "number", "description": description, **extra}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def enum(description: str, *choices: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(choices), "description": description}


def array(description: str, items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, "description": description, **extra}


def obj(properties: dict[str, Any], required: list[str] = (), description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": list(required)}
    if description:
        schema["description"] = description
    return schema


def tool(name: str, description: str, properties: dict[str, Any], required: list[str] = ()) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": obj(properties, required)},
    }


POSITION = obj({"line": integer("1-based line", minimum=1), "column": integer("0-based column", minimum=0)}, ["line", "column"])
ATTENDEE = obj({"email": string("address", format="email"), "optional": boolean("may decline")}, ["email"])
HUNK = obj(
    {"old_start": integer("first old line", minimum=1), "old_lines": array("removed lines", {"type": "string"}),
     "new_lines": array("added lines", {"type": "string"})},
    ["old_start", "old_lines", "new_lines"],
)

TOOL_SUITE: list[dict[str, Any]] = [
    # Files
    tool("read_file", "Read a text file.", {"path": string("file path"), "offset": integer("first line", minimum=0),
         "limit": integer("max lines", minimum=1, maximum=5000)}, ["path"]),
    tool("write_file", "Create or overwrite a file.", {"path": string("file path"), "content": string("full new content")},
         ["path", "content"]),
    tool("edit_file", "Replace an exact string in a file.", {"path": string("file path"), "old_string": string("text to find"),
         "new_string": string("replacement"), "replace_all": boolean("replace every occurrence")},
         ["path", "old_string", "new_string"]),
    tool("apply_patch", "Apply hunks to a file.", {"path": string("file path"), "hunks": array("hunks", HUNK, minItems=1)},
         ["path", "hunks"]),
    tool("list_directory", "List a directory.", {"path": string("directory"), "recursive": boolean("descend"),
         "max_depth": integer("depth limit", minimum=1)}, ["path"]),
    tool("glob_files", "Find files by glob pattern.", {"pattern": string("glob, e.g. **/*.py"), "root": string("search root")},
         ["pattern"]),
    tool("delete_path", "Delete a file or directory.", {"path": string("path"), "recursive": boolean("delete directories")},
         ["path"]),
    tool("move_path", "Move or rename a path.", {"source": string("from"), "destination": string("to"),
         "overwrite": boolean("replace existing")}, ["source", "destination"]),
    tool("create_directory", "Create a directory and its parents.", {"path": string("directory")}, ["path"]),
    tool("file_info", "Size, mode and times of a path.", {"path": string("path")}, ["path"]),
    # Shell and processes
    tool("run_shell", "Run a shell command.", {"command": string("bash command line"), "cwd": string("working directory"),
         "timeout_seconds": integer("limit", minimum=1, maximum=3600),
         "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "extra environment"}},
         ["command"]),
    tool("run_python", "Execute Python code in a sandbox.", {"code": string("source code"),
         "packages": array("pip packages", {"type": "string"})}, ["code"]),
    tool("list_processes", "List running processes.", {"filter": string("name substring"),
         "sort_by": enum("order", "cpu", "memory", "pid")}),
    tool("kill_process", "Signal a process.", {"pid": integer("process id", minimum=1),
         "signal": enum("signal", "TERM", "KILL", "INT", "HUP")}, ["pid"]),
    tool("install_package", "Install a package.", {"name": string("package"), "version": string("version spec"),
         "manager": enum("package manager", "pip", "npm", "apt", "cargo")}, ["name", "manager"]),
    tool("get_env_var", "Read an environment variable.", {"name": string("variable")}, ["name"]),
    # Search
    tool("grep_search", "Search file contents with a regex.", {"pattern": string("regular expression"), "path": string("root"),
         "include": array("globs to include", {"type": "string"}), "case_sensitive": boolean("match case"),
         "context_lines": integer("lines around a hit", minimum=0, maximum=20)}, ["pattern"]),
    tool("semantic_search", "Search code by meaning.", {"query": string("natural-language query"),
         "top_k": integer("results", minimum=1, maximum=50)}, ["query"]),
    tool("find_symbol", "Find a symbol definition.", {"symbol": string("name"), "kind": enum("kind", "function", "class",
         "variable", "module")}, ["symbol"]),
    tool("find_references", "Find references to the symbol at a position.", {"path": string("file"), "position": POSITION},
         ["path", "position"]),
    tool("web_search", "Search the web.", {"query": string("query"), "num_results": integer("results", minimum=1, maximum=20),
         "recency_days": {"type": ["integer", "null"], "description": "only newer results"}}, ["query"]),
    tool("fetch_url", "Fetch a web page as text.", {"url": string("URL", format="uri"), "max_chars": integer("limit")},
         ["url"]),
    # Git and code review
    tool("git_status", "Show the working tree status.", {"porcelain": boolean("machine-readable")}),
    tool("git_diff", "Show a diff.", {"base": string("base ref"), "paths": array("limit to paths", {"type": "string"}),
         "staged": boolean("staged changes")}),
    tool("git_commit", "Commit staged changes.", {"message": string("commit message", minLength=1),
         "amend": boolean("amend the last commit"), "author": obj({"name": string("name"), "email": string("email")},
         ["name", "email"])}, ["message"]),
    tool("git_log", "Show commit history.", {"max_count": integer("commits", minimum=1), "path": string("file filter"),
         "since": string("date", format="date")}),
    tool("git_checkout", "Switch branches.", {"branch": string("branch"), "create": boolean("create it")}, ["branch"]),
    tool("create_pull_request", "Open a pull request.", {"title": string("title"), "body": string("description"),
         "base": string("target branch"), "head": string("source branch"), "draft": boolean("draft"),
         "reviewers": array("logins", {"type": "string"}, uniqueItems=True)}, ["title", "base", "head"]),
    tool("comment_on_line", "Review comment on a diff line.", {"path": string("file"), "line": integer("line", minimum=1),
         "side": enum("diff side", "LEFT", "RIGHT"), "body": string("comment")}, ["path", "line", "body"]),
    tool("run_tests", "Run the test suite.", {"selector": string("test id or path"), "fail_fast": boolean("stop at first"),
         "markers": array("pytest markers", {"type": "string"}), "timeout_seconds": number("limit", minimum=0)}),
    tool("run_linter", "Lint files.", {"paths": array("files", {"type": "string"}, minItems=1),
         "fix": boolean("apply fixes"), "linter": enum("tool", "ruff", "eslint", "clippy")}, ["paths"]),
    # HTTP, data, infra
    tool("http_request", "Send an HTTP request.", {"method": enum("verb", "GET", "POST", "PUT", "PATCH", "DELETE"),
         "url": string("URL"), "headers": {"type": "object", "additionalProperties": {"type": "string"}},
         "body": {"type": ["string", "null"], "description": "request body"}, "timeout": number("seconds")},
         ["method", "url"]),
    tool("sql_query", "Run a read-only SQL query.", {"database": enum("database", "analytics", "billing", "users"),
         "query": string("SQL"), "params": array("bound parameters", {"type": ["string", "number", "boolean", "null"]}),
         "row_limit": integer("rows", minimum=1, maximum=10000)}, ["database", "query"]),
    tool("describe_table", "Show a table's columns.", {"database": string("database"), "table": string("table")},
         ["database", "table"]),
    tool("kubectl_get", "List Kubernetes resources.", {"kind": enum("resource", "pods", "deployments", "services", "nodes"),
         "namespace": string("namespace"), "label_selector": string("labels")}, ["kind"]),
    tool("scale_deployment", "Scale a deployment.", {"namespace": string("namespace"), "name": string("deployment"),
         "replicas": integer("replicas", minimum=0, maximum=100)}, ["namespace", "name", "replicas"]),
    tool("docker_run", "Run a container.", {"image": string("image"), "command": array("argv", {"type": "string"}),
         "ports": array("port maps", obj({"host": integer("host port"), "container": integer("container port"),
         "protocol": enum("protocol", "tcp", "udp")}, ["host", "container"])), "detach": boolean("background")},
         ["image"]),
    tool("query_metrics", "Query time-series metrics.", {"expression": string("PromQL"), "start": string("RFC 3339"),
         "end": string("RFC 3339"), "step_seconds": integer("resolution", minimum=1)}, ["expression"]),
    # Productivity
    tool("send_email", "Send an email.", {"to": array("recipients", {"type": "string"}, minItems=1),
         "cc": array("copy", {"type": "string"}), "subject": string("subject"), "body": string("plain-text body"),
         "attachments": array("files", obj({"filename": string("name"), "content_base64": string("data")},
         ["filename", "content_base64"]))}, ["to", "subject", "body"]),
    tool("create_calendar_event", "Create an event.", {"title": string("title"), "start": string("start", format="date-time"),
         "end": string("end", format="date-time"), "attendees": array("people", ATTENDEE),
         "recurrence": enum("repeat", "none", "daily", "weekly", "monthly"), "location": string("where")},
         ["title", "start", "end"]),
    tool("add_todo", "Add a task.", {"title": string("task"), "priority": enum("priority", "low", "medium", "high", "urgent"),
         "due": string("due date", format="date"), "tags": array("labels", {"type": "string"})}, ["title"]),
    tool("post_message", "Post to a chat channel.", {"channel": string("channel id"), "text": string("message"),
         "thread_id": string("reply in thread"), "mentions": array("user ids", {"type": "string"})},
         ["channel", "text"]),
    tool("create_issue", "File a tracker issue.", {"project": string("key"), "title": string("summary"),
         "description": string("details"), "type": enum("issue type", "bug", "task", "story"),
         "fields": obj({"priority": enum("priority", "P0", "P1", "P2", "P3"), "labels": array("labels", {"type": "string"}),
         "estimate_hours": number("estimate", minimum=0)}, ["priority"])}, ["project", "title", "type"]),
    tool("remember", "Store a fact in long-term memory.", {"key": string("topic"), "value": string("fact"),
         "ttl_days": integer("expiry", minimum=1)}, ["key", "value"]),
    tool("recall", "Look up stored facts.", {"query": string("topic"), "limit": integer("results", minimum=1)}, ["query"]),
    # Everyday APIs
    tool("get_weather", "Current weather.", {"location": string("city or lat,lon"),
         "unit": enum("temperature unit", "celsius", "fahrenheit")}, ["location"]),
    tool("get_forecast", "Daily forecast.", {"location": string("place"), "days": integer("days", minimum=1, maximum=14)},
         ["location", "days"]),
    tool("convert_currency", "Convert money.", {"amount": number("amount", minimum=0), "from_currency": string("ISO 4217"),
         "to_currency": string("ISO 4217")}, ["amount", "from_currency", "to_currency"]),
    tool("stock_quote", "Latest stock price.", {"symbol": string("ticker", pattern="^[A-Z.]{1,6}$")}, ["symbol"]),
    tool("calculator", "Evaluate arithmetic.", {"expression": string("e.g. (2+3)*4")}, ["expression"]),
    tool("unit_convert", "Convert units.", {"value": number("value"), "from_unit": string("unit"), "to_unit": string("unit")},
         ["value", "from_unit", "to_unit"]),
    tool("translate_text", "Translate text.", {"text": string("text"), "target_language": enum("language", "en", "de", "fr",
         "es", "zh", "ja"), "formality": enum("tone", "default", "formal", "informal")}, ["text", "target_language"]),
    tool("get_directions", "Route between places.", {"origin": string("from"), "destination": string("to"),
         "mode": enum("travel mode", "driving", "walking", "cycling", "transit"),
         "waypoints": array("stops", {"type": "string"}, maxItems=8)}, ["origin", "destination"]),
    tool("search_flights", "Find flights.", {"origin": string("IATA code"), "destination": string("IATA code"),
         "depart_date": string("date", format="date"), "return_date": string("date", format="date"),
         "passengers": obj({"adults": integer("adults", minimum=1), "children": integer("children", minimum=0)},
         ["adults"]), "cabin": enum("cabin", "economy", "premium", "business", "first")},
         ["origin", "destination", "depart_date", "passengers"]),
    tool("book_hotel", "Reserve a room.", {"hotel_id": string("hotel"), "check_in": string("date", format="date"),
         "check_out": string("date", format="date"), "guests": integer("guests", minimum=1),
         "preferences": obj({"smoking": boolean("smoking room"), "bed": enum("bed", "single", "double", "twin")})},
         ["hotel_id", "check_in", "check_out", "guests"]),
    tool("generate_image", "Create an image from a prompt.", {"prompt": string("description"),
         "size": enum("size", "256x256", "512x512", "1024x1024"), "n": integer("images", minimum=1, maximum=4)},
         ["prompt"]),
    tool("browser_action", "Act in a web page.", {"action": enum("action", "click", "type", "scroll", "navigate"),
         "selector": string("CSS selector"), "text": string("text to type"),
         "coordinates": obj({"x": number("x"), "y": number("y")}, ["x", "y"])}, ["action"]),
    tool("notebook_edit_cell", "Edit a notebook cell.", {"notebook_path": string("ipynb file"),
         "cell_index": integer("cell", minimum=0), "source": string("new source"),
         "cell_type": enum("type", "code", "markdown"), "mode": enum("edit mode", "replace", "insert", "delete")},
         ["notebook_path", "cell_index", "mode"]),
    tool("get_current_time", "The current time.", {"timezone": string("IANA zone")}),
    tool("no_argument_ping", "Check that the service is up.", {}),
]

TOOL_NAMES = [tool_["function"]["name"] for tool_ in TOOL_SUITE]

# One tool per JSON Schema keyword users send that a grammar may not express: each is enforced by the grammar
# or checked on the finished call (rollout_server/tool_calls/schema_keywords.py), so every call is valid.
TREE_NODE = {"type": "object", "properties": {"label": string("node label", maxLength=12),
                                              "children": array("sub-nodes", {"$ref": "#/$defs/node"}, maxItems=2)},
             "required": ["label"], "additionalProperties": False}
KEYWORD_TOOLS: list[dict[str, Any]] = [
    tool("tag_items", "Tag items by id (uniqueItems).", {"ids": array("distinct ids", integer("id", minimum=1,
         maximum=3), minItems=2, maxItems=2, uniqueItems=True)}, ["ids"]),
    tool("set_title", "Set a title (minLength, maxLength).", {"title": string("title", minLength=3, maxLength=20)},
         ["title"]),
    tool("create_branch", "Create a branch (pattern).", {"name": string("branch", pattern="^[a-z]+(-[a-z]+)*$")},
         ["name"]),
    tool("schedule_on", "Schedule on a day (format).", {"day": string("ISO date", format="date"),
         "notify": string("address", format="email")}, ["day", "notify"]),
    tool("set_dose", "Set a dose (multipleOf).", {"units": integer("units", multipleOf=5, minimum=0, maximum=50),
         "step": number("step", multipleOf=0.25, minimum=0, maximum=2)}, ["units", "step"]),
    tool("pick_reviewers", "Pick reviewers (minItems, maxItems).", {"users": array("users", string("login"),
         minItems=1, maxItems=3)}, ["users"]),
    tool("set_mode", "Set a mode (enum, const).", {"mode": enum("mode", "fast", "safe"),
         "version": {"const": 2, "description": "API version"}}, ["mode", "version"]),
    tool("set_limit", "Set a limit (oneOf, anyOf, allOf).", {
         "limit": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "enum": ["none"]}]},
         "unit": {"anyOf": [{"type": "string", "enum": ["s", "ms"]}, {"type": "null"}]},
         "share": {"allOf": [{"type": "number", "minimum": 0}, {"type": "number", "maximum": 1}]}},
         ["limit", "unit", "share"]),
    {"type": "function", "function": {"name": "build_tree", "description": "Build a tree ($ref recursion).",
     "parameters": {"$defs": {"node": TREE_NODE}, "type": "object",
                    "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}}},
    {"type": "function", "function": {"name": "set_env", "description": "Set variables (additionalProperties).",
     "parameters": {"type": "object", "properties": {"vars": {"type": "object", "maxProperties": 3,
                    "additionalProperties": string("value", maxLength=10)}}, "required": ["vars"],
                    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "send_invoice", "description": "Send an invoice (dependentRequired).",
     "parameters": {"type": "object", "properties": {"amount": integer("cents", minimum=1, maximum=999),
                    "currency": enum("currency", "EUR", "USD"), "note": string("note", maxLength=20)},
                    "required": ["amount"], "dependentRequired": {"amount": ["currency"]}}}},
    {"type": "function", "function": {"name": "deploy_to", "description": "Deploy somewhere (if/then).",
     "parameters": {"type": "object", "properties": {"target": enum("target", "prod", "staging"),
                    "approver": string("who approved", maxLength=12)}, "required": ["target"],
                    "if": {"properties": {"target": {"const": "prod"}}, "required": ["target"]},
                    "then": {"required": ["approver"]}}}},
]


def tools_for_request(count: int) -> list[dict[str, Any]]:
    """`count` (1..128) tools with distinct names: the suite first, then renamed copies."""
    if not 1 <= count <= 128:
        raise ValueError("count must be between 1 and 128")
    tools = []
    for index in range(count):
        base = TOOL_SUITE[index % len(TOOL_SUITE)]
        copy_number = index // len(TOOL_SUITE)
        tool_ = copy.deepcopy(base)
        if copy_number:
            tool_["function"]["name"] += f"_v{copy_number + 1}"
            tool_["function"]["description"] += f" (variant {copy_number + 1})"
        tools.append(tool_)
    return tools


# ---- Compile-time micro-benchmark -------------------------------------------------


@dataclass
class CompileTiming:
    format_name: str
    tool_count: int
    parse_ms: float  # xgrammar.Grammar.from_structural_tag: vLLM's API-server check
    cold_compile_ms: float  # GrammarCompiler.compile_structural_tag, token masks included
    cached_get_ms: float  # GrammarCache.get on a hit


def measure_compile_times(tokenizer: Any, counts=(1, 16, 128), repeats: int = 3) -> list[CompileTiming]:
    """Median times over `repeats` for each format and tool count, with this HF tokenizer."""
    import asyncio

    import xgrammar

    from rollout_server.tool_calls import FORMATS, GrammarCache

    tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    timings = []
    for fmt in FORMATS:
        for count in counts:
            tools = tools_for_request(count)
            tag_json = json.dumps(fmt.structural_tag(tools, "auto", True))
            parse = [_seconds(lambda: xgrammar.Grammar.from_structural_tag(tag_json)) for _ in range(repeats)]
            cold = []
            for _ in range(repeats):
                compiler = xgrammar.GrammarCompiler(tokenizer_info, cache_enabled=False)
                cold.append(_seconds(lambda: compiler.compile_structural_tag(tag_json)))
            cache = GrammarCache()
            asyncio.run(cache.get(tools, "auto", True, fmt))
            cached = [asyncio.run(_timed_get(cache, tools, fmt)) for _ in range(repeats)]
            timings.append(CompileTiming(fmt.name, count, *(1000 * statistics.median(t) for t in (parse, cold, cached))))
    return timings


async def _timed_get(cache: Any, tools: list[dict[str, Any]], fmt: Any) -> float:
    started = time.perf_counter()
    await cache.get(tools, "auto", True, fmt)
    return time.perf_counter() - started


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description="Compile times of the suite's structural tags with xgrammar.")
    parser.add_argument("tokenizer_dir", nargs="?", help="a Hugging Face tokenizer directory (default: the tiny model)")
    tokenizer_dir = parser.parse_args().tokenizer_dir
    if tokenizer_dir is None:
        from rollout_server.tiny_model.builder import ensure_tiny_model

        tokenizer_dir = ensure_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    print(f"tokenizer: {tokenizer_dir} ({len(tokenizer)} tokens)")
    print(f"{'format':<12}{'tools':>6}{'parse ms':>10}{'cold ms':>10}{'cached ms':>11}")
    for timing in measure_compile_times(tokenizer):
        print(f"{timing.format_name:<12}{timing.tool_count:>6}{timing.parse_ms:>10.1f}"
              f"{timing.cold_compile_ms:>10.1f}{timing.cached_get_ms:>11.3f}")


if __name__ == "__main__":
    main()

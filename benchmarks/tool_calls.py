"""Tool calls on the tiny model: rollout-serve's grammar-enforced path vs plain vLLM.

What is measured
----------------
The same fixed suite of chat requests is sent to two systems, one after the other:

- ours:  rollout-serve (front door -> Dynamo -> one vLLM worker); the front door turns
         `tools` + `tool_choice` into an xgrammar structural tag and parses the output;
- vllm:  a plain vLLM OpenAI server configured as its docs recommend for tool calling,
         `--enable-auto-tool-choice --tool-call-parser hermes`, with strict tools:
         `--tool-strict-level parameter`, which vLLM documents as "pins argument
         schemas, as if every tool were `strict: true`".

Both serve the same model directory (`--cache-dir`/models/tiny-qwen2-v0) and get
byte-identical request bodies, so both render the same prompt. Strictness is set on
the vLLM server rather than with `"strict": true` in each tool because the chat
template renders that key too, making every prompt longer (128 tools: ~18.4K tokens
without it with the tiny model's tokenizer).
The suite (`build_suite`) is `--per-mode` requests with `tool_choice: "required"`
(and `parallel_tool_calls: false`, so exactly one call is expected) plus as many with
a named `tool_choice` (exactly one call of that function expected). Tool counts cycle
through 1, 2, 4, ..., 128, drawn from the 60 tools of `benchmarks/tool_schemas.py`
(file edit, shell, search, nested objects, enums, arrays, maps, optional and required
fields, and renamed copies past 60). Sets of up to 8 tools start at a different
place in the suite for each request; the 16..128-tool sets are always the suite's
first N tools, so their long prompts (up to ~32K tokens) share one cached prefix.
The named function cycles through the request's tools. Then one named request per tool of
`KEYWORD_TOOLS`: one JSON Schema keyword each (uniqueItems, minLength/maxLength, pattern, format,
multipleOf, minItems/maxItems, enum/const, oneOf/anyOf/allOf, $ref recursion, additionalProperties,
dependentRequired, if/then), which our path enforces in the grammar or checks on the finished call and
samples again (docs/tool_calls.md); `valid_rate_keyword` is their share. Sampling: temperature 1.0 with
a fixed seed per request, `max_tokens` 256. The tiny model was trained for about a
minute to write short tool calls (`rollout_server/tiny_model/training.py`); with random
weights it never closed a JSON string and most calls were cut by `max_tokens`.

Prefix-cache warm-up, and why: before the suite, every request's exact prompt is sent
once *without* a seed (tool_choice "none", max_tokens 1), so the seeded request then
prefills only its last partial KV block. vLLM 0.32 on CPU kills its engine when a
seeded request is prefilled in chunks (`gpu_model_runner._bookkeeping_sync` calls
`torch.Generator.set_offset`, which CPU generators refuse: "CPU Generator does not use
offset"); chunking starts past 2,048 prompt tokens (vLLM's CPU default for
max_num_batched_tokens). rollout-serve's workers rewind the generator another way
(engine/worker/cpu_seeded_chunks.py); the plain vLLM baseline runs as its docs recommend, so
both are warmed alike to keep the comparison fair.

How each response is judged (`judge`):

- valid:            the response holds exactly one tool call; its name is one of the
                    request's tools (and is the named one for a named choice); its
                    `arguments` parse as JSON and validate, with `jsonschema`
                    (draft 2020-12, `format` not asserted, as that draft specifies),
                    against the tool's `parameters` exactly as sent; and the response
                    did not end with finish_reason "length".
- cut by length:    finish_reason "length" (the token budget ended the output). Such
                    a response is never counted valid. `valid_rate` counts it as a
                    failure; `valid_rate_complete` leaves it out of the denominator.
- lost as content:  the response holds no tool call but non-empty `content`: the
                    client receives text where a call was mandatory. Counted whatever
                    the finish reason; `lost_with_markup` is the subset whose content
                    contains `<tool_call>` (call text handed over as plain text), and
                    `lost_as_content_not_cut` the subset not ending with "length".
- no call:          no tool call and no content.
- length bounds only: schema failures that pass once minLength/maxLength are removed
                    (xgrammar 0.2.8 cannot enforce them on JSON strings, so our Hermes
                    path drops them), so the figure can be read honestly.
- problem counts (schema_invalid, multiple_calls, ...) cover complete responses only
                    (not cut by length).
- format violations: valid calls whose strings break a `format` this jsonschema can
                    check (date, email, ...); informational, not part of validity.

Also: xgrammar compile time of our structural tag for 1/16/128 tools, cold (token masks
included, compiler cache off) and on a GrammarCache hit (`measure_compile_times`).

Run:    .venv/bin/python benchmarks/tool_calls.py [--cache-dir DIR]   (about 4 minutes on 2 busy cores,
        plus the model build, ~2 minutes, when DIR holds no current tiny model)
Writes: benchmarks/results/tool_calls.json (one flat object).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.frontdoor import start_plain_vllm, stop_group  # noqa: E402
from benchmarks.tool_schemas import KEYWORD_TOOLS, TOOL_SUITE, measure_compile_times, tools_for_request  # noqa: E402
from rollout_server.harness.stack import CACHE_DIR, free_port_block, start_stack  # noqa: E402
from rollout_server.tiny_model.builder import ensure_tiny_model  # noqa: E402
from rollout_server.tool_calls.schema_keywords import grammar_schema  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "tool_calls.json"
MODEL = "tiny-qwen2"
TOOL_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
LARGEST_ROTATED_SET = 8  # bigger sets are always the suite's first N tools (shared prefix)
POOL = tools_for_request(128)  # the 60-tool suite, then renamed copies; 128 distinct names
USER_MESSAGES = [
    "The test test_parse_dates fails on main. Find out why and fix it.",
    "Rename utils.py to helpers.py and update every import.",
    "What's the weather in Lisbon tomorrow, and book me a hotel there for two nights?",
    "Open a pull request for the branch fix/login-timeout against main.",
    "Search the codebase for uses of the deprecated `fetch_all` helper.",
    "Run the linter on src/ and apply its fixes.",
    "Scale the checkout deployment in namespace prod to 6 replicas.",
    "Email the release notes to the team and schedule a retro for Friday at 3pm.",
]


# ---- the suite ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    index: int
    mode: str  # "required", "named", or "keyword" (a named tool of KEYWORD_TOOLS)
    tools: list[dict[str, Any]]
    named: str | None  # the forced function for a named choice
    seed: int
    message: str

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}


def draw_tools(count: int, index: int) -> list[dict[str, Any]]:
    """`count` tools; small sets start at a different suite position per request."""
    start = (index * 7) % len(TOOL_SUITE) if count <= LARGEST_ROTATED_SET else 0
    return [POOL[(start + k) % len(POOL)] for k in range(count)]


def build_suite(per_mode: int) -> list[Case]:
    cases = []
    for mode in ("required", "named"):
        for i in range(per_mode):
            index = len(cases)
            tools = draw_tools(TOOL_COUNTS[i % len(TOOL_COUNTS)], index)
            named = tools[(index * 17) % len(tools)]["function"]["name"] if mode == "named" else None
            cases.append(Case(index, mode, tools, named, seed=1000 + index,
                              message=USER_MESSAGES[index % len(USER_MESSAGES)]))
    for keyword_tool in KEYWORD_TOOLS:  # each named once, beside three tools of the suite
        index = len(cases)
        tools = [keyword_tool, *draw_tools(3, index)]
        cases.append(Case(index, "keyword", tools, keyword_tool["function"]["name"], seed=1000 + index,
                          message=USER_MESSAGES[index % len(USER_MESSAGES)]))
    return cases


def request_body(case: Case, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": case.message}], "tools": case.tools,
            "temperature": 1.0, "seed": case.seed, "max_tokens": max_tokens}
    if case.mode == "required":
        body.update(tool_choice="required", parallel_tool_calls=False)
    else:
        body["tool_choice"] = {"type": "function", "function": {"name": case.named}}
    return body


# ---- sending ------------------------------------------------------------------------------

async def post_chat(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    response = await http.post(f"{url}/v1/chat/completions", json=body)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


async def warm_prefix_cache(url: str, cases: list[Case], max_tokens: int) -> None:
    """Prefill every case's prompt once, unseeded, largest tool sets first (see the module docstring)."""
    async with httpx.AsyncClient(timeout=900) as http:
        for case in sorted(cases, key=lambda c: -len(c.tools)):
            body = {**request_body(case, max_tokens), "tool_choice": "none", "max_tokens": 1}
            for key in ("seed", "parallel_tool_calls"):
                body.pop(key, None)
            status, answer = await post_chat(http, url, body)
            if status != 200:
                raise RuntimeError(f"warm-up of #{case.index} ({len(case.tools)} tools) failed: HTTP {status} {answer}")


async def send_suite(url: str, cases: list[Case], max_tokens: int, concurrency: int) -> list[tuple[int, Any]]:
    """Every case's (HTTP status, response body), in suite order."""
    results: list[tuple[int, Any]] = [(0, None)] * len(cases)
    pending = list(reversed(cases))
    async with httpx.AsyncClient(timeout=900) as http:
        async def worker() -> None:
            while pending:
                case = pending.pop()
                results[case.index] = await post_chat(http, url, request_body(case, max_tokens))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


# ---- judging ------------------------------------------------------------------------------

@dataclass
class Verdict:
    valid: bool
    finish_reason: str
    cut: bool = False
    lost_as_content: bool = False
    lost_with_markup: bool = False
    no_call: bool = False
    problem: str | None = None  # why the call is not valid: "multiple calls", "schema", ...
    length_bounds_only: bool = False
    format_violation: bool = False


def judge(case: Case, status: int, body: Any) -> Verdict:
    if status != 200:
        return Verdict(valid=False, finish_reason=f"http_{status}", problem="http error")
    choice = body["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    calls, content = message.get("tool_calls") or [], (message.get("content") or "")
    verdict = Verdict(valid=False, finish_reason=finish, cut=finish == "length")
    if not calls:
        verdict.lost_as_content = bool(content.strip())
        verdict.lost_with_markup = "<tool_call>" in content
        verdict.no_call = not verdict.lost_as_content
        verdict.problem = "no call"
        return verdict
    verdict.problem = "multiple calls" if len(calls) > 1 else call_problem(case, calls[0]["function"])
    if verdict.problem == "schema":
        verdict.length_bounds_only = passes_without_length_bounds(case, calls[0]["function"])
    verdict.valid = verdict.problem is None and not verdict.cut
    verdict.format_violation = verdict.valid and breaks_a_format(case, calls[0]["function"])
    return verdict


def call_problem(case: Case, function: dict[str, Any]) -> str | None:
    """None when the call is declared, is the named one (if any) and its arguments fit the schema."""
    name = function.get("name")
    if name not in case.schemas:
        return "undeclared name"
    if case.named is not None and name != case.named:
        return "not the named function"
    try:
        arguments = json.loads(function.get("arguments") or "")
    except json.JSONDecodeError:
        return "arguments not JSON"
    if not jsonschema.Draft202012Validator(case.schemas[name]).is_valid(arguments):
        return "schema"
    return None


def passes_without_length_bounds(case: Case, function: dict[str, Any]) -> bool:
    schema = grammar_schema(case.schemas[function["name"]], json_strings=True)
    return jsonschema.Draft202012Validator(schema).is_valid(json.loads(function["arguments"]))


def breaks_a_format(case: Case, function: dict[str, Any]) -> bool:
    validator = jsonschema.Draft202012Validator(case.schemas[function["name"]],
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return not validator.is_valid(json.loads(function["arguments"]))


def summarise(cases: list[Case], verdicts: list[Verdict]) -> dict[str, Any]:
    total = len(verdicts)
    complete = [v for v in verdicts if not v.cut]
    count = lambda attribute: sum(getattr(v, attribute) for v in verdicts)  # noqa: E731
    problems = Counter(v.problem for v in verdicts if v.problem and not v.cut)
    summary = {
        "requests": total,
        "valid": count("valid"),
        "valid_rate": count("valid") / total,
        "valid_rate_complete": sum(v.valid for v in complete) / max(len(complete), 1),
        "lost_as_content": count("lost_as_content"),
        "lost_with_markup": count("lost_with_markup"),
        "lost_as_content_not_cut": sum(v.lost_as_content for v in complete),
        "no_call": count("no_call"),
        "cut_by_length": count("cut"),
        "invalid_complete": len(complete) - sum(v.valid for v in complete),
        "schema_invalid": problems["schema"],
        "schema_invalid_length_bounds_only": sum(v.length_bounds_only for v in verdicts if not v.cut),
        "wrong_or_undeclared_name": problems["undeclared name"] + problems["not the named function"],
        "arguments_not_json": problems["arguments not JSON"],
        "multiple_calls": problems["multiple calls"],
        "http_errors": problems["http error"],
        "format_violations_info": count("format_violation"),
    }
    for mode in ("required", "named", "keyword"):
        mine = [v for c, v in zip(cases, verdicts) if c.mode == mode]
        summary[f"valid_rate_{mode}"] = sum(v.valid for v in mine) / max(len(mine), 1)
    for reason, n in sorted(Counter(v.finish_reason for v in verdicts).items()):
        summary[f"finish_{reason}"] = n
    return summary


# ---- the two systems ----------------------------------------------------------------------

def start_plain_vllm_with_tool_parser(model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    """frontdoor.py's plain vLLM server plus the flags vLLM's docs give for (strict) tool calling."""
    return start_plain_vllm(model_dir, port, log, extra_args=(
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter"))


def run_suite(url: str, cases: list[Case], args: argparse.Namespace) -> tuple[list[Verdict], list, float]:
    started = time.perf_counter()
    asyncio.run(warm_prefix_cache(url, cases, args.max_tokens))
    print(f"   prefix cache warmed in {time.perf_counter() - started:.0f}s", flush=True)
    started = time.perf_counter()
    responses = asyncio.run(send_suite(url, cases, args.max_tokens, args.concurrency))
    wall = time.perf_counter() - started
    return [judge(c, *r) for c, r in zip(cases, responses)], responses, wall


def run_ours(model_dir: Path, tmp: Path, cases: list[Case], args: argparse.Namespace):
    stack = start_stack(tmp / "stack", workers=1, extra_args=["--model", str(model_dir), "--served-model-name", MODEL])
    try:
        return run_suite(stack.url, cases, args)
    finally:
        stack.stop()


def run_plain_vllm(model_dir: Path, tmp: Path, cases: list[Case], args: argparse.Namespace):
    port = free_port_block(1, start=29000)
    server = start_plain_vllm_with_tool_parser(model_dir, port, tmp / "vllm.log")
    try:
        return run_suite(f"http://127.0.0.1:{port}", cases, args)
    finally:
        stop_group(server)


# ---- the model and compile times -----------------------------------------------------------

def model_figures(model_dir: Path) -> dict[str, Any]:
    """How the served tiny model was built: its recipe and training time, from its rollout_serve.json."""
    built = json.loads((model_dir / "rollout_serve.json").read_text())
    training = built.get("training", {})
    return {"model_recipe": built["recipe"], "model_train_s": round(training.get("seconds", 0.0), 1),
            "model_train_cpu_s": round(training.get("cpu_seconds", 0.0), 1),
            "model_train_steps": training.get("steps", 0), "model_train_loss": round(training.get("last_loss", 0.0), 3)}


def compile_figures(model_dir: Path) -> dict[str, float]:
    from transformers import AutoTokenizer

    figures = {}
    for timing in measure_compile_times(AutoTokenizer.from_pretrained(model_dir)):
        prefix = "compile_ms" if timing.format_name == "hermes" else f"compile_ms_{timing.format_name}"
        figures[f"{prefix}_{timing.tool_count}_tools_cold"] = timing.cold_compile_ms
        figures[f"{prefix}_{timing.tool_count}_tools_cached"] = timing.cached_get_ms
        figures[f"{prefix}_{timing.tool_count}_tools_parse"] = timing.parse_ms
    return figures


# ---- reporting ----------------------------------------------------------------------------

def print_failures(system: str, cases: list[Case], verdicts: list[Verdict], responses: list, limit: int) -> None:
    """The first `limit` responses that are not valid: request, the called tool's schema, raw output."""
    failures = [(c, v, r) for c, v, r in zip(cases, verdicts, responses) if not v.valid]
    if failures:
        print(f"-- {system}: {len(failures)} requests not valid (showing {min(limit, len(failures))})")
    for case, verdict, (status, body) in failures[:limit]:
        print(f"   #{case.index} {case.mode} {len(case.tools)} tools named={case.named} seed={case.seed} "
              f"finish={verdict.finish_reason} problem={verdict.problem}")
        output = body["choices"][0] if status == 200 else body
        called = _first_called_name(output) if status == 200 else None
        if called in case.schemas:
            print(f"      schema of {called}: {json.dumps(case.schemas[called])}")
        print(f"      output: {json.dumps(output)[:1500]}")


def _first_called_name(choice: dict[str, Any]) -> str | None:
    calls = choice["message"].get("tool_calls") or []
    return calls[0]["function"].get("name") if calls else None


def print_table(ours: dict[str, Any] | None, vllm: dict[str, Any] | None) -> None:
    keys = list(dict.fromkeys([*(ours or {}), *(vllm or {})]))
    show = lambda s, k: "-" if s is None or k not in s else (f"{s[k]:.1%}" if "rate" in k else str(s[k]))  # noqa: E731
    print(f"{'':34s}{'ours':>12s}{'plain vLLM':>14s}")
    for key in keys:
        print(f"{key:34s}{show(ours, key):>12s}{show(vllm, key):>14s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-mode", type=int, default=30, help="requests per tool_choice mode and system")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--systems", default="ours,vllm", help="comma-separated subset of ours,vllm")
    parser.add_argument("--show-failures", type=int, default=5, help="failing responses printed per system")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                        help="where the tiny model is built or found (DIR/models); default: the test cache")
    args = parser.parse_args()
    started = time.perf_counter()
    model_dir = ensure_tiny_model(0, args.cache_dir / "models")
    tmp = Path(tempfile.mkdtemp(prefix="tool-calls-bench-"))
    cases = build_suite(args.per_mode)
    figures: dict[str, Any] = {"requests_per_system": len(cases), "max_tokens": args.max_tokens, "temperature": 1.0,
                               **model_figures(model_dir)}

    print("== grammar compile time (hermes, tiny model tokenizer, median of 3)", flush=True)
    figures.update(compile_figures(model_dir))
    for n in (1, 16, 128):
        print(f"   {n:3d} tools: cold {figures[f'compile_ms_{n}_tools_cold']:8.1f} ms   "
              f"cached {figures[f'compile_ms_{n}_tools_cached']:6.3f} ms", flush=True)

    summaries: dict[str, dict[str, Any] | None] = {"ours": None, "vllm": None}
    runners = {"ours": lambda: run_ours(model_dir, tmp, cases, args),
               "vllm": lambda: run_plain_vllm(model_dir, tmp, cases, args)}
    for system in args.systems.split(","):
        print(f"== {system}: {len(cases)} requests ({args.per_mode} required + {args.per_mode} named + "
              f"{len(KEYWORD_TOOLS)} keyword)", flush=True)
        verdicts, responses, wall = runners[system]()
        summaries[system] = {**summarise(cases, verdicts), "suite_wall_s": round(wall, 1)}
        print_failures(system, cases, verdicts, responses, args.show_failures)
        figures.update({f"{system}_{key}": value for key, value in summaries[system].items()})

    print("== side by side", flush=True)
    print_table(summaries["ours"], summaries["vllm"])
    figures["runtime_s"] = round(time.perf_counter() - started, 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}, indent=1))
    print(f"total {figures['runtime_s']:.0f}s; wrote {RESULTS}")


if __name__ == "__main__":
    main()

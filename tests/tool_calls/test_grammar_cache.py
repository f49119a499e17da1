"""GrammarCache: one compile per tool set, off the event loop, errors as 400s."""

import asyncio
import json
import time

import pytest
from tool_call_helpers import function_tool, tokenizer, tool_schemas_module

from rollout_server.tool_calls import GrammarCache, ToolRequestError, cache_key

TOOLS = [function_tool("read_file", {"path": {"type": "string"}}, ["path"])]


def test_second_request_is_a_hit(fmt):
    async def scenario():
        cache = GrammarCache()
        first = await cache.get(TOOLS, "auto", True, fmt)
        second = await cache.get(TOOLS, "auto", True, fmt)
        return cache, first, second

    cache, first, second = asyncio.run(scenario())
    assert first == second and first["structured_outputs"]["structural_tag"]
    assert (cache.stats.misses, cache.stats.hits) == (1, 1)


def test_key_covers_tools_choice_parallel_and_format():
    from rollout_server.tool_calls import format_by_name

    hermes, xml = format_by_name("hermes"), format_by_name("xml_params")
    other_tools = [function_tool("read_file", {"path": {"type": "integer"}}, ["path"])]
    keys = {
        cache_key(TOOLS, "auto", True, hermes),
        cache_key(other_tools, "auto", True, hermes),
        cache_key(TOOLS, "required", True, hermes),
        cache_key(TOOLS, "auto", False, hermes),
        cache_key(TOOLS, "auto", True, xml),
    }
    assert len(keys) == 5


def test_concurrent_requests_share_one_compile(fmt):
    async def scenario():
        cache = GrammarCache()
        results = await asyncio.gather(*(cache.get(TOOLS, "required", False, fmt) for _ in range(8)))
        return cache, results

    cache, results = asyncio.run(scenario())
    assert cache.stats.misses == 1 and cache.stats.hits == 7
    assert all(result == results[0] for result in results)


def test_bad_requests_raise_and_are_not_cached(fmt):
    async def scenario():
        cache = GrammarCache()
        for _ in range(2):
            with pytest.raises(ToolRequestError) as caught:
                await cache.get(TOOLS, {"type": "function", "function": {"name": "nope"}}, True, fmt)
            assert caught.value.param == "tool_choice"
        return cache

    assert len(asyncio.run(scenario()).compiled) == 0


def test_schema_xgrammar_cannot_compile_is_a_request_error(fmt):
    # Valid JSON Schema, but an unresolvable $ref: only the grammar compiler notices.
    tools = [function_tool("f", {"a": {"$ref": "#/$defs/missing"}}, ["a"])]
    with pytest.raises(ToolRequestError) as caught:
        asyncio.run(GrammarCache().get(tools, "auto", True, fmt))
    assert caught.value.param == "tools"


def test_entries_past_the_byte_budget_are_evicted_oldest_first(fmt):
    async def scenario(budget_bytes: int):
        cache = GrammarCache(budget_bytes=budget_bytes)
        for name in ("a", "b", "c"):
            await cache.get([function_tool(name, {})], "auto", True, fmt)
        return cache

    whole = asyncio.run(scenario(2**20))
    assert len(whole.compiled) == 3
    entry = whole.compiled.size_bytes // 3  # three tool sets alike but for a one-letter name
    cache = asyncio.run(scenario(2 * entry + entry // 2))
    assert len(cache.compiled) == 2 and cache.compiled.size_bytes <= 2 * entry + entry // 2
    assert asyncio.run(scenario(entry // 2)).compiled.size_bytes == 0  # larger than the whole budget: not kept


async def longest_loop_stall(work) -> tuple[float, float]:
    """Runs `work` while a 1 ms ticker measures the event loop's longest pause."""
    longest = 0.0

    async def ticker(stop: asyncio.Event):
        nonlocal longest
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    stop = asyncio.Event()
    ticking = asyncio.create_task(ticker(stop))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - started
    stop.set()
    await ticking
    return elapsed, longest


def test_compiling_128_tools_does_not_stall_the_event_loop():
    from rollout_server.tool_calls import format_by_name

    tools = tool_schemas_module().tools_for_request(128)
    fmt = format_by_name("hermes")
    cache = GrammarCache.for_tokenizer(tokenizer())

    async def through_the_cache():
        await cache.get(tools, "auto", True, fmt)

    async def on_the_loop():  # the negative control: what a blocking compile looks like
        cache.compiler.compile_structural_tag(json.dumps(fmt.structural_tag(tools, "required", True)))

    compile_time, stall = asyncio.run(longest_loop_stall(through_the_cache))
    blocking_time, blocking_stall = asyncio.run(longest_loop_stall(on_the_loop))
    assert blocking_stall >= 0.9 * blocking_time  # the ticker does see a blocked loop
    assert compile_time > 0.05, "too fast to tell: the stall bound below would mean nothing"
    assert stall < 0.3 * compile_time, f"loop stalled {stall * 1000:.0f} ms during a {compile_time * 1000:.0f} ms compile"

"""Tool calls that are valid by construction.

The request's tools and tool_choice become an xgrammar structural tag that vLLM
enforces while sampling; the model's output is parsed back into OpenAI `tool_calls`,
whole or as stream deltas. One module per call format; see docs/tool_calls.md.
"""

from rollout_server.tool_calls.base import TaggedCallFormat, ToolCallFormat
from rollout_server.tool_calls.grammar_cache import CacheStats, GrammarCache, cache_key, vllm_body_fragment
from rollout_server.tool_calls.hermes import HermesFormat
from rollout_server.tool_calls.output import ParsedOutput, finish_reason_for, fold_deltas
from rollout_server.tool_calls.registry import FORMATS, format_by_name, format_for_chat_template, register_format
from rollout_server.tool_calls.request import ToolRequestError, validate_tool_request
from rollout_server.tool_calls.stream import StreamParser
from rollout_server.tool_calls.xml_params import XmlParamsFormat

__all__ = [
    "FORMATS",
    "CacheStats",
    "GrammarCache",
    "HermesFormat",
    "ParsedOutput",
    "StreamParser",
    "TaggedCallFormat",
    "ToolCallFormat",
    "ToolRequestError",
    "XmlParamsFormat",
    "cache_key",
    "finish_reason_for",
    "fold_deltas",
    "format_by_name",
    "format_for_chat_template",
    "register_format",
    "validate_tool_request",
    "vllm_body_fragment",
]

"""Streaming: OpenAI-shaped deltas, and the same answer however the text is chunked."""

import json
import random

import pytest
from tool_call_helpers import RENDERERS, TRICKY_TEXT, function_tool

from rollout_server.tool_calls import fold_deltas

TOOLS = [
    function_tool("edit_file", {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"},
                                "line": {"type": "integer"}}, ["path"]),
    function_tool("ping", {}),
]


@pytest.fixture
def sample(fmt):
    call = RENDERERS[fmt.name]
    return (
        "I'll edit <this> file.\n"
        + call("edit_file", {"path": "src/a.py", "old": TRICKY_TEXT, "new": "x\\y </parameter-ish>", "line": 7})
        + "\n"
        + call("ping", {})
        + "\nDone."
    )


def stream(fmt, pieces, finish_reason="stop"):
    parser = fmt.stream_parser(TOOLS)
    deltas = [delta for piece in pieces for delta in parser.feed(piece)]
    final_deltas, final_reason = parser.finish(finish_reason)
    return deltas + final_deltas, final_reason


def without_ids(calls):
    return [{**call, "id": None} for call in calls]


def random_pieces(text, seed):
    rng = random.Random(seed)
    pieces, position = [], 0
    while position < len(text):
        size = rng.choice([1, 1, 2, 3, 5, 8, 13])
        pieces.append(text[position : position + size])
        position += size
    return pieces


def test_streamed_equals_parsed(fmt, sample):
    parsed = fmt.parse(sample, TOOLS)
    deltas, reason = stream(fmt, list(sample))
    content, calls = fold_deltas(deltas)
    # Whitespace around calls is kept where content follows it (byte-exact concatenation).
    assert content == parsed.content == "I'll edit <this> file.\n\n\nDone."
    assert without_ids(calls) == without_ids(parsed.tool_calls)
    assert json.loads(calls[0]["function"]["arguments"])["old"] == TRICKY_TEXT
    assert reason == "tool_calls"


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_gives_the_same_message(fmt, sample, seed):
    expected_content, expected_calls = fold_deltas(stream(fmt, [sample])[0])
    content, calls = fold_deltas(stream(fmt, random_pieces(sample, seed))[0])
    assert (content, without_ids(calls)) == (expected_content, without_ids(expected_calls))


def test_every_two_piece_split_gives_the_same_message(fmt, sample):
    expected = fold_deltas(stream(fmt, [sample])[0])
    for cut in range(1, len(sample)):
        content, calls = fold_deltas(stream(fmt, [sample[:cut], sample[cut:]])[0])
        assert (content, without_ids(calls)) == (expected[0], without_ids(expected[1])), cut


def test_delta_shapes_follow_openai(fmt, sample):
    deltas, _ = stream(fmt, list(sample))
    call_deltas = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    starts = [d for d in call_deltas if "id" in d]
    assert [s["index"] for s in starts] == [0, 1]
    for start in starts:
        assert start["id"].startswith("call_") and start["type"] == "function"
        assert start["function"]["arguments"] == ""
    fragments = [d for d in call_deltas if "id" not in d]
    assert fragments and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in fragments)
    # The name comes first: no fragment for a call before its start delta.
    first_start_position = call_deltas.index(starts[0])
    assert all(d["index"] == 0 for d in call_deltas[:first_start_position + 1])
    assert all(set(d) == {"content"} or set(d) == {"tool_calls"} for d in deltas)


def test_arguments_stream_before_the_call_ends(fmt):
    text = RENDERERS[fmt.name]("edit_file", {"path": "p", "new": "a long replacement text"})
    parser = fmt.stream_parser(TOOLS)
    emitted = "".join(
        d["tool_calls"][0]["function"]["arguments"] for d in parser.feed(text[: text.index("replacement")]) if "tool_calls" in d
    )
    # A trailing whitespace character is held back: it may be the formatting before </parameter>.
    assert emitted.endswith("a long " if fmt.name == "hermes" else "a long")


def test_call_ids_are_random(fmt):
    text = RENDERERS[fmt.name]("ping", {})
    first, second = fmt.parse(text, TOOLS), fmt.parse(text, TOOLS)
    assert first.tool_calls[0]["id"] != second.tool_calls[0]["id"]


def test_cut_call_ends_with_length_not_stop(fmt, sample):
    cut = sample[: sample.index("src/a.py") + 4]
    deltas, reason = stream(fmt, list(cut), finish_reason="stop")  # e.g. a stop string cut it
    assert reason == "length"
    content, calls = fold_deltas(deltas)
    assert content == "I'll edit <this> file."
    assert calls[0]["function"]["name"] == "edit_file"


def test_text_only_stream_keeps_trailing_whitespace(fmt):
    deltas, reason = stream(fmt, ["Hello ", "<tool", "ing>", " world\n\n"])
    assert fold_deltas(deltas) == ("Hello <tooling> world\n\n", [])
    assert reason == "stop"

"""A returning session's prompt is tokenized from where its last turn ended, to exactly the ids of the whole."""

import asyncio
import copy
from functools import lru_cache
from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout_server.auth import Principal
from rollout_server.protocol import TokenizeRequest
from rollout_server.session_prompts import SessionPrompts, cut_markers_of, session_prompts_for
from rollout_server.settings import Settings
from rollout_server.tokenization import tokenize
from rollout_server.tokenizer import ModelTokenizer
from rollout_server.tool_calls.grammar_cache import GrammarCache
from tests.tiny_models import untrained_tiny_model

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


@lru_cache(maxsize=None)
def tokenizer(session_prompt_tokens: int = 1_000_000) -> ModelTokenizer:
    return ModelTokenizer(untrained_tiny_model(), session_prompt_tokens)


def agent_turns(n: int) -> list[list[dict]]:
    """The conversations an agent sends over n turns: each the one before, its reply and a tool result."""
    messages = [{"role": "system", "content": "You edit code.\n" + "def f(x):\n    return x  # é\n" * 200},
                {"role": "user", "content": "Fix the bug in main.py"}]
    turns = []
    for i in range(n):
        turns.append(list(messages))
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": {"path": f"f{i}.py"}}}
        messages += [{"role": "assistant", "content": f"Reading f{i}.py ", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": f"  print({i})\n\n" * 50}]
    return turns


def test_every_returning_turn_has_the_ids_of_its_whole_prompt_and_reuses_the_turn_before():
    tok = tokenizer()
    reused = []
    for messages in agent_turns(5):
        before = tok.session_prompts.reused_tokens
        ids = tok.render_chat(messages, TOOLS, session_id="agent-1")
        reference = tok.hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
        assert ids == list(reference)
        reused.append((tok.session_prompts.reused_tokens - before, len(ids)))
    assert reused[0][0] == 0
    for (now, _), (_, previous_length) in zip(reused[1:], reused):
        assert previous_length - 8 <= now < previous_length  # all but "<|im_start|>assistant\n"


def test_an_edited_history_is_tokenized_whole_and_still_exact():
    tok = tokenizer()
    first, second = agent_turns(2)
    tok.render_chat(first, TOOLS, session_id="edited")
    second[0] = {"role": "system", "content": "Another system prompt."}
    before = tok.session_prompts.reused_tokens
    ids = tok.render_chat(second, TOOLS, session_id="edited")
    assert tok.session_prompts.reused_tokens == before
    assert ids == list(tok.hf.apply_chat_template(second, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))


def test_a_prompt_that_goes_on_where_no_special_token_follows_is_not_cut_there():
    """"A<|im_start|>..." keeps "A"; "AB..." starts with "A" but is tokenized with B as one piece."""
    tok = tokenizer()
    prompts = tok.session_prompts
    prompts.encode("glued", "hello wor<|im_start|>assistant\n")
    before = prompts.reused_tokens
    assert prompts.encode("glued", "hello world") == tok.encode("hello world")
    assert prompts.reused_tokens == before


def test_prompts_without_a_named_session_keep_nothing():
    tok = tokenizer()
    before = tok.session_prompts.reused_tokens
    for messages in agent_turns(2):
        tok.render_chat(messages, TOOLS)
    assert tok.session_prompts.reused_tokens == before


def test_a_session_id_is_kept_per_team():
    """Team B naming team A's session gets no head start from A's prompt (nor a way to time a guess at it)."""
    tok = tokenizer(2_000_000)  # a tokenizer of its own: counts from other tests do not interfere
    ctx = SimpleNamespace(tokenizer=tok, max_model_len=32768, tool_format=None,  # test double: ServingContext
                          grammars=GrammarCache(), settings=Settings())
    first, second = agent_turns(2)

    def tokenize_as(team: str, messages: list[dict]) -> int:
        before = tok.session_prompts.reused_tokens
        req = TokenizeRequest(messages=messages, tools=TOOLS)
        ids = asyncio.run(tokenize(ctx, req, "shared-id", Principal(team, None, is_admin=False)))["tokens"]
        assert ids == tok.render_chat(messages, TOOLS)
        return tok.session_prompts.reused_tokens - before

    assert tokenize_as("a", first) == 0
    assert tokenize_as("b", second) == 0
    assert tokenize_as("a", second) > 0


def test_past_its_token_budget_the_least_recent_session_is_dropped():
    tok = tokenizer()
    prompts = SessionPrompts(tok.encode, cut_markers_of(tok.hf), max_tokens=60)
    turn = "<|im_start|>user\n" + "word " * 20 + "<|im_end|>\n"
    for session in ("old", "new"):
        prompts.encode(session, turn + "<|im_start|>assistant\n")  # ~25 tokens kept each
    prompts.encode("new", turn * 2 + "<|im_start|>assistant\n")  # ~50: "old" must go
    before = prompts.reused_tokens
    prompts.encode("old", turn * 2 + "<|im_start|>assistant\n")
    assert prompts.reused_tokens == before
    prompts.encode("new", turn * 3 + "<|im_start|>assistant\n")  # "old" (~50) took its place
    assert prompts.reused_tokens == before


def test_a_tokenizer_whose_pieces_do_not_add_up_keeps_no_prefixes():
    """A tokenizer that puts a BOS before every text it encodes would repeat it at every cut."""
    hf = tokenizer().hf
    with_bos = session_prompts_for(hf, lambda text: [0] + hf.encode(text, add_special_tokens=False), 1_000_000)
    assert not with_bos.enabled
    assert session_prompts_for(hf, lambda text: hf.encode(text, add_special_tokens=False), 1_000_000).enabled


def test_cuts_are_made_before_chatml_markers_only():
    markers = cut_markers_of(tokenizer().hf)
    assert "<|im_start|>" in markers and "</parameter>" not in markers
    # Of those, only the ones the chat template writes are searched for in every prompt.
    assert "<|endoftext|>" in markers
    assert tokenizer().session_prompts._markers == ["<|im_start|>", "<|im_end|>"]


def test_a_template_that_refuses_the_probe_conversation_is_probed_with_its_markers():
    hf = copy.deepcopy(tokenizer().hf)
    hf.chat_template = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                        "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    prompts = session_prompts_for(hf, lambda text: hf.encode(text, add_special_tokens=False), 1_000_000)
    assert prompts.enabled


FRAGMENTS = ["<|im_start|>", "<|im_end|>", "user\n", "assistant\n", " ", "  ", "\n", "\n\n", "\t", "a", "ab", "é", "👋",
             "def", " f(x)", "123", "{\"k\": 1}", "<|im", "start|>"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.lists(st.sampled_from(FRAGMENTS), max_size=12)), min_size=1, max_size=6))
@example([(0, ["re", "<|im_start|>"]), (len("<|im_start|>"), ["turn"])])  # "re" kept; "return" is one word
def test_any_sequence_of_turns_tokenizes_as_whole_texts_do(turns):
    """Each turn keeps the first `k` characters of the one before (all, or an edit) and adds fragments."""
    tok = tokenizer()
    prompts = SessionPrompts(tok.encode, cut_markers_of(tok.hf), max_tokens=1_000_000)
    text = ""
    for keep_back, added in turns:
        text = text[:max(0, len(text) - keep_back)] + "".join(added)
        assert prompts.encode("property", text) == tok.encode(text)

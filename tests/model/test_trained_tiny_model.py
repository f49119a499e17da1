"""The tiny model the stack serves (the full training recipe, in the shared test cache): it has learned to finish
tool calls under the grammar at temperature 1.0, and its two variants are different trained checkpoints."""

import json

import jsonschema
import pytest
import torch
import xgrammar
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.tool_schemas import TOOL_SUITE
from rollout_server.tool_calls import format_by_name
from rollout_server.tool_calls.schema_keywords import grammar_schema
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack  # the trained model takes minutes to build

FORMATS = {"hermes": "hermes", "xml": "xml_params"}  # tiny model tool_format -> call format
ALLOWED_UNFINISHED = {"hermes": 0, "xml": 1}  # of the 12 HARD_TOOLS calls

HARD_TOOLS = ["apply_patch", "send_email", "create_calendar_event", "docker_run", "search_flights", "create_issue",
              "http_request", "run_shell", "sql_query", "edit_file", "create_pull_request", "grep_search"]


def sample_under_grammar(model, tokenizer, prompt_ids: list[int], structural_tag: dict, seed: int,
                         max_tokens: int) -> tuple[str, bool]:
    """Temperature-1.0 sampling masked by the xgrammar structural tag, as vLLM does; (text, ended by EOS)."""
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_structural_tag(json.dumps(structural_tag)))
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    ids, past, written = torch.tensor([prompt_ids]), None, []
    with torch.no_grad():
        for _ in range(max_tokens):
            out = model(input_ids=ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgrammar.apply_token_bitmask_inplace(logits, bitmask)
            token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator))
            if token == tokenizer.eos_token_id:
                return tokenizer.decode(written), True
            assert matcher.accept_token(token)
            written.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(written), False


@pytest.mark.timeout(1800)  # builds the model into the shared test cache when it is missing
@pytest.mark.parametrize("tool_format", list(FORMATS))
def test_the_served_model_finishes_calls_under_the_grammar_at_temperature_1(tool_format):
    model_dir = trained_tiny_model(0, tool_format)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fmt = format_by_name(FORMATS[tool_format])
    by_name = {t["function"]["name"]: t for t in TOOL_SUITE}
    lengths, unfinished = [], []
    for index, name in enumerate(HARD_TOOLS):
        others = [t for t in TOOL_SUITE if t["function"]["name"] != name]
        tools = [by_name[name]] + [others[(index * 7 + k) % len(others)] for k in range(3)]
        messages = [{"role": "user", "content": f"Please use {name} for the task in main.py."}]
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tag = fmt.structural_tag(tools, {"type": "function", "function": {"name": name}}, False)
        text, ended = sample_under_grammar(model, tokenizer, prompt_ids, tag, seed=index, max_tokens=256)
        if not ended:
            unfinished.append(f"{name}: {text!r}")
            continue
        [call] = fmt.parse(text, tools).tool_calls
        parameters = by_name[name]["function"]["parameters"]
        schema = grammar_schema(parameters, json_strings=tool_format == "hermes")
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    # XML values are raw text with no closing quote: the model must learn to end one with `\n</parameter>`,
    # and after its short training it runs past 256 tokens in 1 of these 12 calls (Hermes: none).
    assert len(unfinished) <= ALLOWED_UNFINISHED[tool_format], "calls that did not finish within 256 tokens:\n" + \
        "\n".join(unfinished)
    # Short calls, as a deployed model writes them (this build: median 102 tokens; 256 is the cut).
    assert sorted(lengths)[len(lengths) // 2] < 128, f"calls are long: {lengths}"


@pytest.mark.timeout(1800)
def test_variants_are_trained_checkpoints_whose_greedy_outputs_differ():
    prompts = ["The quick brown fox jumps over the lazy dog and then",  # the deploy tests' prompt
               "<|im_start|>user\nWhat is in main.py?<|im_end|>\n<|im_start|>assistant\n"]
    greedy = {}
    for variant in (0, 1):
        model_dir = trained_tiny_model(variant)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert json.loads((model_dir / "rollout_serve.json").read_text())["training"]["steps"] > 0
        greedy[variant] = []
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
            greedy[variant].append(out[0, ids.shape[1]:].tolist())
    assert all(a != b for a, b in zip(greedy[0], greedy[1])), greedy

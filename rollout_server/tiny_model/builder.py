"""The tiny model: a few-million-parameter Qwen2 built locally, deterministically.

No model hub is reachable from our machines, so the project makes its own model:
a byte-level BPE tokenizer trained on a generated corpus, a ChatML chat template
that renders tools and tool calls (Qwen2.5 / Hermes style), and Qwen2 weights
initialised from a seed, then trained for about two minutes to write tool calls
(`tiny_model_training.py`). The tokenizer never depends on the variant, so every
variant is a drop-in checkpoint for the same base model (the deploy path swaps one
for another).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollout_server.tiny_model.training import TrainingRecipe, TrainingReport, tool_corpus, train_tool_calling

if TYPE_CHECKING:
    from rollout_server.settings import Settings

log = logging.getLogger(__name__)

TINY_MODEL_NAME = "tiny-qwen2"  # the id clients use for the default model
BASE_SEED = 1234
RECIPE_VERSION = 5  # bump when the corpus, the tokenizer or the weight initialisation changes (training: TrainingRecipe)
BPE_VOCAB_SIZE = 4096
CONTEXT_WINDOW = 32768
# Training's float results follow the vector kernels torch, MKL and oneDNN pick for the CPU: the same seed gives
# other weights with AVX-512 kernels than with AVX2 ones, so tests that sample from the model would pass on one
# machine and fail on another.
# Builds run in a child process held to the AVX2 kernels every x86-64 machine of this project has (elsewhere,
# to torch's plain kernels).
X86_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
REPRODUCIBLE_KERNELS = X86_KERNELS if platform.machine() in ("x86_64", "AMD64") else {"ATEN_CPU_CAPABILITY": "default"}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (not special) tokens: they survive skip_special_tokens, as in Qwen2.5. The XML call markup is one
# token per tag too, so a value's end (`\n</parameter>`) is as plain to the model as `<tool_call>`.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               "<function=", "</function>", "<parameter=", "</parameter>"]
# Qwen3's reasoning markers, added tokens as there. The tiny model never writes them, but clients that render
# Qwen3 conversations themselves (verifiers' Qwen3 renderer) look them up.
THINK_TOKENS = ["<think>", "</think>"]


@dataclass(frozen=True)
class TinyModelShape:
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    bpe_vocab_size: int = BPE_VOCAB_SIZE
    max_position_embeddings: int = CONTEXT_WINDOW


def chat_template(tool_instructions: str, render_call: str) -> str:
    """Qwen3's ChatML template; the two tool-call formats differ only in how tools are introduced and calls written.

    It renders what Qwen3's own template renders (and verifiers' Qwen3 renderer, token for token), but for one
    rule: an assistant turn gets a `<think>` block only when it carries reasoning (`reasoning_content`, or text
    before `</think>` in its content) and follows the last user query. Qwen3's template also writes an empty
    block into the conversation's last assistant turn; the tiny model does not think, so it is trained, and
    prompted, without one. Turns before the last user query lose their reasoning, as in Qwen3.

    HF renders chat templates with trim_blocks (a newline right after a block tag is dropped),
    so every newline that follows a tag is written as {{ nl }}.
    """
    return (
        "{% set nl = '\\n' %}"
        # The last user query: tool responses sent as user turns do not count (multi-step tool use).
        "{% set ns = namespace(last_query=messages | length - 1, multi_step=true) %}"
        "{% for message in messages[::-1] %}{% set index = messages | length - 1 - loop.index0 %}"
        "{% if ns.multi_step and message['role'] == 'user' and not "
        "(message['content'].startswith('<tool_response>') and message['content'].endswith('</tool_response>')) %}"
        "{% set ns.multi_step = false %}{% set ns.last_query = index %}{% endif %}"
        "{% endfor %}"
        "{% if tools %}"
        "<|im_start|>system\n"
        "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{{ nl }}{{ nl }}{% endif %}"
        + tool_instructions +
        "{% elif messages[0]['role'] == 'system' %}"
        "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
        "{% endif %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' and loop.first %}"
        "{% elif message['role'] == 'assistant' %}"
        "{% set content = message['content'] or '' %}{% set reasoning = '' %}"
        "{% if message['reasoning_content'] is string %}{% set reasoning = message['reasoning_content'] %}"
        "{% elif '</think>' in content %}"
        "{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip(nl) %}"
        "{% set content = content.split('</think>', 1)[1].lstrip(nl) %}"
        "{% endif %}"
        "<|im_start|>assistant\n"
        "{% if reasoning and loop.index0 > ns.last_query %}"
        "<think>\n{{ reasoning.strip(nl) }}\n</think>\n\n{{ content.lstrip(nl) }}"
        "{% else %}{{ content }}{% endif %}"
        "{% for call in message.get('tool_calls') or [] %}"
        "{% set fn = call['function'] if call['function'] is defined else call %}"
        "{% if not loop.first or content %}{{ nl }}{% endif %}"
        + render_call +
        "{% endfor %}<|im_end|>\n"
        "{% elif message['role'] == 'tool' %}"
        "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
        "{{ nl }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
        "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
        "{% else %}"
        "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# Qwen2.5 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
CHAT_TEMPLATE = chat_template(
    tool_instructions=(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        "{% for tool in tools %}{{ nl }}{{ tool | tojson }}{% endfor %}"
        "{{ nl }}</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    ),
    render_call=(
        "<tool_call>\n{\"name\": \"{{ fn['name'] }}\", \"arguments\": "
        "{% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
        "}\n</tool_call>"
    ),
)

# Qwen3-Coder / GLM: <tool_call><function=name><parameter=key>value</parameter></function></tool_call>
XML_CHAT_TEMPLATE = chat_template(
    tool_instructions=(
        "# Tools\n\nYou have access to the following functions:\n\n<tools>"
        "{% for tool in tools %}{{ nl }}{{ tool | tojson }}{% endfor %}"
        "{{ nl }}</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
        "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
    ),
    render_call=(
        "<tool_call>\n<function={{ fn['name'] }}>"
        "{% for key, value in (fn['arguments'] or {}).items() %}"
        "{{ nl }}<parameter={{ key }}>\n{% if value is string %}{{ value }}{% else %}{{ value | tojson }}{% endif %}"
        "{{ nl }}</parameter>"
        "{% endfor %}"
        "{{ nl }}</function>\n</tool_call>"
    ),
)
TEMPLATES = {"hermes": CHAT_TEMPLATE, "xml": XML_CHAT_TEMPLATE}

def default_cache_dir() -> Path:
    from rollout_server.settings import Settings

    return Settings().state.cache_dir / "models"


def tiny_model_dir(variant: int = 0, cache_dir: Path | None = None, tool_format: str = "hermes") -> Path:
    suffix = "" if tool_format == "hermes" else f"-{tool_format}"
    return (cache_dir or default_cache_dir()) / f"tiny-qwen2-v{variant}{suffix}"


def ensure_tiny_model(variant: int = 0, cache_dir: Path | None = None, tool_format: str = "hermes",
                      training: TrainingRecipe = TrainingRecipe()) -> Path:
    """Returns the tiny model's directory, building it first if it is missing or from an older recipe.

    tool_format picks the chat template's tool-call syntax: "hermes" (<tool_call>{json}</tool_call>)
    or "xml" (<function=name><parameter=key>value</parameter>); the weights learn to write that syntax.
    """
    target = tiny_model_dir(variant, cache_dir, tool_format)
    if _is_current(target, training):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (test workers, benchmark, server) may ask at once: one builds.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(target, training):
            _build_in_child(target, variant, tool_format, training)
    return target


def _build_in_child(target: Path, variant: int, tool_format: str, training: TrainingRecipe) -> None:
    """build_tiny_model in a fresh interpreter, whose torch starts on REPRODUCIBLE_KERNELS (read at import)."""
    spec = json.dumps({"target": str(target), "variant": variant, "tool_format": tool_format,
                       "training": asdict(training)})
    built = subprocess.run([sys.executable, "-m", "rollout_server.tiny_model.builder", spec],
                           env={**os.environ, **REPRODUCIBLE_KERNELS})
    if built.returncode != 0:
        raise RuntimeError(f"building the tiny model into {target} failed (exit {built.returncode}); see above")


def resolve_model(settings: Settings) -> tuple[Path, str]:
    """The model directory a server serves and the id clients use: `--model`, else the tiny model
    (built first when missing)."""
    engine = settings.engine
    if engine.model is None:
        return ensure_tiny_model(0, settings.state.cache_dir / "models"), engine.served_model_name or TINY_MODEL_NAME
    model_dir = engine.model.expanduser().resolve()
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"--model {model_dir}: not a Hugging Face model directory (no config.json); "
                         "no model hub is reachable, pass a local directory")
    return model_dir, engine.served_model_name or model_dir.name


def _recipe(tool_format: str, shape: TinyModelShape = TinyModelShape(),
            training: TrainingRecipe = TrainingRecipe()) -> str:
    """A fingerprint of how the model is built: a cached model from an older recipe is rebuilt."""
    recipe = json.dumps([RECIPE_VERSION, BPE_VOCAB_SIZE, asdict(shape), TEMPLATES[tool_format], training.fingerprint()])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _is_current(target: Path, training: TrainingRecipe) -> bool:
    try:
        built = json.loads((target / "rollout_serve.json").read_text())
    except (OSError, ValueError):
        return False
    expected = _recipe(built.get("tool_format", "hermes"), training=training)
    return (target / "config.json").exists() and built.get("recipe") == expected


def build_tiny_model(target: Path, variant: int = 0, shape: TinyModelShape = TinyModelShape(),
                     tool_format: str = "hermes", training: TrainingRecipe = TrainingRecipe()) -> Path:
    """Builds the model into a temp dir beside `target`, then renames it into place."""
    log.info("building tiny model variant %d into %s", variant, target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = _train_tokenizer(shape.bpe_vocab_size)
        tokenizer.chat_template = TEMPLATES[tool_format]
        tokenizer.save_pretrained(staging)
        _declare_no_unk_token(staging)
        report = _write_weights(staging, shape, seed=BASE_SEED + variant, tokenizer=tokenizer, training=training)
        (staging / "rollout_serve.json").write_text(json.dumps({
            "variant": variant, "seed": BASE_SEED + variant, "tool_format": tool_format,
            "recipe": _recipe(tool_format, shape, training), "training": asdict(report)}))
        if target.exists():
            shutil.rmtree(target)
        staging.chmod(0o755)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _train_tokenizer(vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # JSON closers are tokens of their own: a token such as `"]}` would bundle several decisions the grammar
    # checks one by one, and a model whose favourite closer is masked out keeps writing the string instead.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[,\]}]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=CONTEXT_WINDOW,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(TOOL_TOKENS + THINK_TOKENS)
    return tokenizer


def _declare_no_unk_token(model_dir: Path) -> None:
    """Writes `"unk_token": null` into tokenizer_config.json, as Qwen's own tokenizers do.

    A byte-level BPE has no unknown token. Left unset, transformers' Qwen2 tokenizer class (which loads this
    model by its config's model_type, e.g. under transformers 4) takes `<|endoftext|>` for the unknown token,
    and clients that check special tokens against it (verifiers' renderers) refuse the tokenizer."""
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["unk_token"] = None
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _training_corpus(lines: int = 6000):
    """English-like prose, code, JSON and tool calls, from a fixed seed: the tokenizer is identical on every machine."""
    yield from tool_corpus(BASE_SEED, lines // 2)
    rng = random.Random(BASE_SEED)
    words = (
        "the a of to and in is it you that for on with as are this be at or from have not by but what all "
        "when can there use each which she do how their if will up other about out many then them these so "
        "some would make like him into time has look two more write go see number no way could people my "
        "than first water been call who oil its now find long down day did get come made may part file "
        "function return import class def self value list string error read write open close path user "
        "session model token cache worker request response prompt tool search edit shell run test json"
    ).split()
    snippets = [
        'def {w}({v}):\n    return {v} + 1\n',
        '{{"name": "{w}", "arguments": {{"{v}": "{w}"}}}}',
        'for {v} in range(10):\n    print("{w}", {v})\n',
        "<tool_call>\n{{\"name\": \"{w}\", \"arguments\": {{}}}}\n</tool_call>",
        "if ({v} < 0 && {w} > 1) {{ return '{w}'; }}",
    ]
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ing", "er", "ion", "st"]
    words += ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(3000)]
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 25)))
        code = rng.choice(snippets).format(w=rng.choice(words), v=rng.choice(words))
        yield sentence.capitalize() + ". " + code


def _write_weights(staging: Path, shape: TinyModelShape, seed: int, tokenizer,
                   training: TrainingRecipe) -> TrainingReport:
    """Initialises the weights from `seed`, teaches them the chat template's tool calls, saves them."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    # The embedding covers every token, added ones included, padded to a multiple of 64 as Qwen does.
    vocab_size = -(-len(tokenizer) // 64) * 64
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    report = train_tool_calling(model, tokenizer, seed, training)
    log.info("trained %d steps in %.0f s (%.0f s CPU), %d learned tokens, loss %.2f -> %.2f", report.steps,
             report.seconds, report.cpu_seconds, report.trained_tokens, report.first_loss, report.last_loss)
    model.save_pretrained(staging, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    log.info("tiny model: %.1fM parameters, vocab %d, context %d", params / 1e6, vocab_size, shape.max_position_embeddings)
    return report


if __name__ == "__main__":  # the child process of _build_in_child
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _spec = json.loads(sys.argv[1])
    build_tiny_model(Path(_spec["target"]), _spec["variant"], tool_format=_spec["tool_format"],
                     training=TrainingRecipe(**_spec["training"]))

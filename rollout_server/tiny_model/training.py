"""Teaching the tiny model to write tool calls: synthetic conversations and a short CPU training run.

Randomly initialised weights never close a JSON string, so under a tool-call grammar
every call runs until max_tokens. A deployed model has learned to finish its calls;
the tiny model learns it here, in about two minutes on one core: next-token training on
ChatML conversations generated in code and rendered by the model's own chat template
(Hermes JSON calls, or XML-parameter calls for the `-xml` model), with assistant turns
that are short plain text or compact calls (arguments of a few words, small numbers,
enums, 1-3 item arrays, nested objects), each closed and followed by <|im_end|>.

Everything is drawn from one seed and trained on one thread, so a seed gives the
same weights on every run; another seed (another variant) gives other weights.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingRecipe:
    """How the tiny model is trained; part of the model's recipe fingerprint."""

    steps: int = 180
    rows_per_step: int = 4
    # Conversations run on from row to row; short rows keep attention (most of a step's cost) cheap.
    row_tokens: int = 512
    learning_rate: float = 5e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    max_tools: int = 3  # tools declared per conversation

    def fingerprint(self) -> dict[str, Any]:
        return {"data_version": DATA_VERSION, **asdict(self)}


DATA_VERSION = 2  # bump when the conversation generator changes (it also feeds the tokenizer)


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


@dataclass
class TrainingReport:
    steps: int
    seconds: float
    cpu_seconds: float
    first_loss: float
    last_loss: float
    trained_tokens: int


# ---- words ---------------------------------------------------------------------------------

VERBS = ("get list create update delete search send run read write find check set open close move book "
         "convert fetch scale start stop add remove show count sync upload download schedule cancel").split()
NOUNS = ("file user issue order weather message branch event table page image task note record service "
         "report invoice ticket repo commit job build deploy flight hotel email channel metric alert "
         "folder project account document comment review price stock calendar contact").split()
TOPICS = ("main config report draft login timeout release notes team friday budget api cache server "
          "database backup invoice meeting lisbon paris tokyo berlin london retry error patch docs "
          "staging prod alpha beta green blue summary update weekly urgent").split()
FILLER = ("the a of to and in for on with new old next last first my our this that all").split()
FILES = ("src/app.py README.md tests/test_api.py main.go lib/utils.js setup.cfg docs/index.md "
         "Makefile config.yaml data/users.csv").split()
USER_OPENERS = ("Please", "Can you", "I need to", "Could you", "Help me", "Now", "Quickly", "Then")
REPLIES = ("Done.", "Here is what I found.", "The {t} is ready.", "I updated the {t}.", "All {t} checks passed.",
           "Sure, the {t} looks fine.", "I could not find the {t}.", "The {t} was sent to the team.")
STRING_FORMATS = {
    "date": lambda rng: f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "date-time": lambda rng: f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
    "email": lambda rng: f"{rng.choice(TOPICS)}@example.com",
    "uri": lambda rng: f"https://{rng.choice(TOPICS)}.com/{rng.choice(TOPICS)}",
}


def phrase(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(TOPICS if rng.random() < 0.6 else FILLER) for _ in range(rng.randint(low, high))]
    return " ".join(words)


VALUE_WORDS = TOPICS + FILLER
# Common words far more often than rare ones (Zipf), and mostly one or two of them: a model that has
# seen predictable values writes short, predictable values at temperature 1.0.
VALUE_WORD_WEIGHTS = [1 / (rank + 1) for rank in range(len(VALUE_WORDS))]
VALUE_LENGTH_WEIGHTS = (45, 35, 15, 5)  # 1, 2, 3 or 4 words


def value_phrase(rng: random.Random) -> str:
    count = rng.choices(range(1, 5), weights=VALUE_LENGTH_WEIGHTS)[0]
    return " ".join(rng.choices(VALUE_WORDS, weights=VALUE_WORD_WEIGHTS, k=count))


def snake_name(rng: random.Random) -> str:
    parts = [rng.choice(VERBS), rng.choice(NOUNS)] + ([rng.choice(TOPICS)] if rng.random() < 0.2 else [])
    return "_".join(parts)


# ---- tool schemas --------------------------------------------------------------------------

def random_tool(rng: random.Random) -> dict[str, Any]:
    parameters = random_object_schema(rng, depth=0, size=rng.choice((0, 1, 2, 2, 3, 3, 4, 5, 6)))
    return {"type": "function", "function": {
        "name": snake_name(rng), "description": phrase(rng, 2, 5).capitalize() + ".", "parameters": parameters}}


def random_object_schema(rng: random.Random, depth: int, size: int) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for _ in range(size):
        kind = rng.choices(PROPERTY_KINDS, weights=PROPERTY_WEIGHTS)[0]
        if depth > 0 and kind in ("object", "object_array"):
            kind = "string_array"
        properties.setdefault(key_for(kind, rng), random_property(kind, rng, depth))
    required = [key for key in properties if rng.random() < 0.6]
    return {"type": "object", "properties": properties, "required": required}


def key_for(kind: str, rng: random.Random) -> str:
    """Mostly a name that fits the kind (`url` for a URI, `limit` for an integer), as real schemas have."""
    if kind in KEYS_BY_KIND and rng.random() < 0.7:
        return rng.choice(KEYS_BY_KIND[kind])
    key = rng.choice(GENERIC_KEYS if rng.random() < 0.5 else NOUNS + TOPICS)
    return key + "_" + rng.choice(NOUNS) if rng.random() < 0.2 else key


def random_property(kind: str, rng: random.Random, depth: int) -> dict[str, Any]:
    schema = PROPERTY_MAKERS[kind](rng, depth)
    if rng.random() < 0.3:
        schema["description"] = phrase(rng, 1, 4)
    return schema


PROPERTY_MAKERS = {
    "string": lambda rng, depth: {"type": "string"},
    "uri": lambda rng, depth: {"type": "string", "format": "uri"},
    "date": lambda rng, depth: {"type": "string", "format": "date"},
    "date-time": lambda rng, depth: {"type": "string", "format": "date-time"},
    "email": lambda rng, depth: {"type": "string", "format": "email"},
    "path": lambda rng, depth: {"type": "string", "description": "file path"},
    "integer": lambda rng, depth: {"type": "integer", **_bounds(rng)},
    "number": lambda rng, depth: {"type": "number", **({"minimum": 0} if rng.random() < 0.5 else {})},
    "boolean": lambda rng, depth: {"type": "boolean"},
    "enum": lambda rng, depth: {"type": "string", "enum": rng.sample(TOPICS, rng.randint(2, 5))},
    "nullable": lambda rng, depth: {"type": [rng.choice(("string", "integer")), "null"]},
    "string_array": lambda rng, depth: {"type": "array", "items": {"type": "string"}},
    "integer_array": lambda rng, depth: {"type": "array", "items": {"type": "integer"}},
    "object": lambda rng, depth: random_object_schema(rng, depth + 1, rng.randint(1, 3)),
    "object_array": lambda rng, depth: {"type": "array", "items": random_object_schema(rng, depth + 1, rng.randint(1, 3))},
    "map": lambda rng, depth: {"type": "object", "additionalProperties": {"type": "string"}},
}
PROPERTY_KINDS = list(PROPERTY_MAKERS)
PROPERTY_WEIGHTS = [30, 5, 4, 3, 3, 6, 10, 5, 8, 10, 2, 14, 4, 6, 5, 2]
KEYS_BY_KIND = {
    "uri": ["url", "link", "endpoint", "homepage"],
    "date": ["date", "due", "since", "check_in", "day"],
    "date-time": ["start", "end", "when", "starts_at"],
    "email": ["email", "owner", "reply_to"],
    "path": ["path", "file", "source", "destination", "root", "cwd"],
    "integer": ["limit", "count", "line", "timeout", "page", "port", "size", "days", "replicas", "top_k"],
    "number": ["amount", "price", "value", "ratio", "seconds"],
    "boolean": ["recursive", "force", "draft", "enabled", "verbose", "dry_run"],
    "string_array": ["tags", "labels", "paths", "items", "lines", "names"],
    "map": ["env", "headers", "metadata", "options"],
}
GENERIC_KEYS = ("query title body text message name command pattern content label branch city location "
                "language reason summary comment note mode kind id key").split()


def _bounds(rng: random.Random) -> dict[str, int]:
    low = rng.choice((0, 1, 1, 0))
    return {"minimum": low, "maximum": rng.choice((10, 20, 100, 1000, 3600))} if rng.random() < 0.5 else {}


# ---- argument values -----------------------------------------------------------------------

def arguments_for(schema: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Short, schema-valid arguments: required keys always, optional ones now and then, in schema order."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    chosen = {key: value_for(sub, rng) for key, sub in properties.items() if key in required or rng.random() < 0.3}
    if not properties and isinstance(schema.get("additionalProperties"), dict):
        for _ in range(rng.randint(1, 2)):
            chosen[rng.choice(TOPICS).upper()] = value_for(schema["additionalProperties"], rng)
    return chosen


def value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = "null" if rng.random() < 0.2 else next(k for k in kind if k != "null")
    if kind == "string":
        return string_value(schema, rng)
    if kind == "integer":
        return rng.randint(schema.get("minimum", 0), min(schema.get("maximum", 100), 100))
    if kind == "number":
        return round(rng.uniform(0, 50), rng.choice((0, 1, 2)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [value_for(schema["items"], rng) for _ in range(rng.choices((1, 2, 3), weights=(60, 30, 10))[0])]
    if kind == "object":
        return arguments_for(schema, rng)
    return None


def string_value(schema: dict[str, Any], rng: random.Random) -> str:
    if schema.get("format") in STRING_FORMATS:
        return STRING_FORMATS[schema["format"]](rng)
    if schema.get("description") == "file path" or rng.random() < 0.1:
        return rng.choice(FILES)
    return value_phrase(rng)


# ---- tokenizer corpus ----------------------------------------------------------------------

def tool_corpus(seed: int, lines: int) -> Iterator[str]:
    """Tool declarations and calls in both formats, as text: the tokenizer learns their words and punctuation."""
    rng = random.Random(seed)
    for _ in range(lines):
        tool = random_tool(rng)
        function = tool["function"]
        arguments = arguments_for(function["parameters"], rng)
        parameters = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
                             for key, value in arguments.items())
        yield (f"{json.dumps(tool)}\n{json.dumps({'name': function['name'], 'arguments': arguments})}\n"
               f"<function={function['name']}>\n{parameters}</function>\n{user_request(rng)} {reply(rng)}")


# ---- conversations -------------------------------------------------------------------------

def random_conversation(rng: random.Random, max_tools: int) -> Conversation:
    """A system/user exchange with tools declared; the assistant calls them or answers in a few words."""
    tools = random_tools(rng, rng.randint(1, max_tools)) if rng.random() < 0.9 else None
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": f"You are a {rng.choice(TOPICS)} assistant. {phrase(rng, 3, 8)}."})
    for _ in range(rng.choice((1, 2, 3, 4))):
        messages.append({"role": "user", "content": user_request(rng)})
        if tools and rng.random() < 0.8:
            messages += call_turn(rng, tools)
        messages.append({"role": "assistant", "content": reply(rng)})
    return Conversation(messages, tools)


def random_tools(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """`count` tools with distinct names, as a request must declare them."""
    tools: dict[str, dict[str, Any]] = {}
    while len(tools) < count:
        tool = random_tool(rng)
        tools.setdefault(tool["function"]["name"], tool)
    return list(tools.values())


def user_request(rng: random.Random) -> str:
    return f"{rng.choice(USER_OPENERS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} {phrase(rng, 1, 5)}?"


def reply(rng: random.Random) -> str:
    return rng.choice(REPLIES).format(t=rng.choice(TOPICS + NOUNS))


def call_turn(rng: random.Random, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn with 1-3 calls (sometimes after a few words), then one tool result per call."""
    calls = []
    for index in range(rng.choices((1, 2, 3), weights=(60, 30, 10))[0]):
        function = rng.choice(tools)["function"]
        calls.append({"id": f"call_{index}", "type": "function", "function": {
            "name": function["name"], "arguments": arguments_for(function["parameters"], rng)}})
    content = phrase(rng, 2, 6).capitalize() + "." if rng.random() < 0.15 else None
    results = [{"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"result": phrase(rng, 1, 3)})}
               for call in calls]
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


# ---- tokens --------------------------------------------------------------------------------

_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n?(.*?<\|im_end\|>)", re.DOTALL)


def encode(conversation: Conversation, tokenizer) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation, and which of them the model learns to write (assistant turns).

    Only the assistant's turns carry the loss: a model that learns to predict the tool declarations (long
    `enum` and `required` lists) learns that arrays go on and on.
    """
    text = tokenizer.apply_chat_template(conversation.messages, tools=conversation.tools, tokenize=False)
    ids: list[int] = []
    learned: list[bool] = []

    def add(piece: str, is_learned: bool) -> None:
        tokens = tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
        ids.extend(tokens)
        learned.extend([is_learned] * len(tokens))

    # Pieces split where the whole text's tokenization splits too (before <|im_start|>'s turn text,
    # after <|im_end|>), so the ids equal those of the rendered prompt.
    cursor = 0
    for turn in _ASSISTANT_TURN.finditer(text):
        start, end = turn.span(1)
        add(text[cursor:start], False)
        add(text[start:end], True)
        cursor = end
    add(text[cursor:], False)
    return ids, learned


@dataclass
class Rows:
    """A batch: token ids, each token's position in its own conversation, and which tokens carry the loss."""

    ids: list[list[int]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    learned: list[list[bool]] = field(default_factory=list)


class TokenStream:
    """Conversations laid end to end and cut into rows: no padding, a long conversation continues in the next row.

    Positions restart at each conversation; attention still sees the previous one in the row, as in packed
    pre-training, which costs nothing here and keeps every row full.
    """

    def __init__(self, conversations: Iterator[tuple[list[int], list[bool]]]) -> None:
        self.conversations = conversations
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.learned: list[bool] = []

    def rows(self, count: int, length: int) -> Rows:
        batch = Rows()
        for _ in range(count):
            while len(self.ids) < length:
                ids, learned = next(self.conversations)
                self.ids += ids
                self.positions += range(len(ids))
                self.learned += learned
            batch.ids.append(self.ids[:length])
            batch.positions.append(self.positions[:length])
            batch.learned.append(self.learned[:length])
            del self.ids[:length], self.positions[:length], self.learned[:length]
        return batch


# ---- training ------------------------------------------------------------------------------

def train_tool_calling(model, tokenizer, seed: int, recipe: TrainingRecipe = TrainingRecipe(),
                       progress: bool | None = None) -> TrainingReport:
    """Trains `model` in place on conversations drawn from `seed`, rendered by the tokenizer's chat template.

    One thread, so the result is reproducible.
    """
    import torch
    from tqdm import tqdm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = random.Random(seed)
    stream = TokenStream(encode(random_conversation(rng, recipe.max_tools), tokenizer) for _ in iter(int, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, recipe))
    losses, trained_tokens, started, cpu_started = [], 0, time.perf_counter(), time.process_time()
    model.train()
    try:
        with tqdm(total=recipe.steps, desc="training tiny model", unit="step", disable=progress is False) as bar:
            for _ in range(recipe.steps):
                batch = stream.rows(recipe.rows_per_step, recipe.row_tokens)
                loss, tokens = training_step(model, batch, optimizer)
                schedule.step()
                if tokens:
                    losses.append(loss)
                trained_tokens += tokens
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
                bar.update()
    finally:
        torch.set_num_threads(threads)
        model.eval()
    last = losses[-10:] or [math.nan]
    return TrainingReport(recipe.steps, time.perf_counter() - started, time.process_time() - cpu_started,
                          losses[0] if losses else math.nan, sum(last) / len(last), trained_tokens)


def learning_rate_factor(step: int, recipe: TrainingRecipe) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(recipe.steps - recipe.warmup_steps, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def training_step(model, batch: Rows, optimizer) -> tuple[float, int]:
    """One optimizer step on the assistant tokens of `batch`; the LM head runs on those positions only."""
    import torch

    ids = torch.tensor(batch.ids)
    targets = torch.tensor(batch.learned)[:, 1:]  # position t predicts token t+1
    if not targets.any():
        return 0.0, 0
    hidden = model.model(input_ids=ids, position_ids=torch.tensor(batch.positions)).last_hidden_state
    loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[:, :-1][targets]), ids[:, 1:][targets])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item(), int(targets.sum())

"""engine/client/choice_text.py: a choice's text from its ids, ended at stop strings as vLLM and Dynamo end it."""

import pytest
from tokenizers import Tokenizer

from engine.client.choice_text import ChoiceText
from tests.tiny_models import untrained_tiny_model


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(untrained_tiny_model() / "tokenizer.json"))


def stream(text: ChoiceText, ids: list[int], per_message: int = 1) -> tuple[str, list[int], bool]:
    """Feeds `ids` a message at a time: (the text sent, the ids kept, whether a stop string ended it)."""
    sent, kept = "", []
    for start in range(0, len(ids), per_message):
        message = ids[start:start + per_message]
        step = text.add(message)
        sent += step.text
        kept += message[:step.kept]
        if step.stopped:
            return sent, kept, True
    return sent + text.finish(), kept, False


SENTENCE = "the worker reads the file, then the worker writes the notes"


@pytest.mark.parametrize("per_message", [1, 3, 100])
def test_without_stop_strings_the_text_is_the_decoded_ids(tokenizer, per_message):
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False).ids
    assert stream(ChoiceText(tokenizer), ids, per_message) == (tokenizer.decode(ids), ids, False)


@pytest.mark.parametrize("per_message", [1, 4])
@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_ends_the_choice_at_the_token_that_completes_it(tokenizer, per_message, include):
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False).ids
    text, kept, stopped = stream(ChoiceText(tokenizer, ["worker w"], include_stop_str_in_output=include), ids,
                                 per_message)
    assert stopped
    expected = SENTENCE[:SENTENCE.index("worker w") + (len("worker w") if include else 0)]
    assert text == expected
    # the kept ids decode to the text up to the stop string's end, and no id less would
    assert tokenizer.decode(kept).startswith(SENTENCE[:SENTENCE.index("worker w") + len("worker w")])
    assert "worker w" not in tokenizer.decode(kept[:-1])


def test_text_that_may_begin_a_stop_string_is_held_back_until_it_cannot(tokenizer):
    ids = tokenizer.encode("the worker reads", add_special_tokens=False).ids
    text = ChoiceText(tokenizer, ["worker writes"])
    sent = [text.add([token]).text for token in ids]
    assert "".join(sent) + text.finish() == "the worker reads"
    assert not any(piece.endswith(" worker") for piece in sent), sent  # " worker" could have begun the stop
    assert "".join(sent).startswith("the")


def test_the_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False).ids
    text, _, stopped = stream(ChoiceText(tokenizer, ["notes", "file", "reads"]), ids, per_message=100)
    assert stopped and text == "the worker "


def test_stop_strings_wait_for_min_tokens(tokenizer):
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False).ids
    first_stop = stream(ChoiceText(tokenizer, ["the"]), ids)
    assert first_stop[0] == ""
    later = stream(ChoiceText(tokenizer, ["the"], min_tokens=3), ids)
    assert later[2] and later[0].startswith("the worker") and len(later[1]) > 3

from urllib.parse import unquote

import pytest

from engine.http_headers import header_value


@pytest.mark.parametrize("text", ["sess-0123", "team a/run 7: turn 3"])
def test_printable_ascii_is_sent_as_it_is(text):
    assert header_value(text) == text


@pytest.mark.parametrize("text", ["日本", "\U0001F600 50%", "a\r\nx-evil: 1", "a\x00b", "caf\u00e9\t"])
def test_any_other_text_is_percent_encoded_and_reads_back(text):
    sent = header_value(text)
    assert sent.isascii() and sent.isprintable()  # encodable as a header, no line break to inject
    assert unquote(sent) == text

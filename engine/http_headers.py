"""Header values made from what a client sent (session ids, request ids, `user`).

HTTP header values are printable ASCII: a session id in Japanese, an emoji, or a newline would make the
response (or the request to Dynamo) fail to encode after the engine had already done the work. Such
values are sent percent-encoded (UTF-8), as a URL would carry them; the body keeps them as sent.
"""

from __future__ import annotations

from urllib.parse import quote

# Every printable ASCII character but "%" (so that an encoded value reads back unambiguously)
_KEPT = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_KEPT)

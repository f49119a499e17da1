from trace_factory import make_record

from trace_pipeline.redact import redact_record, redact_text

SECRETS = {
    "api_key": "sk-proj-Abc123def456GHI789jkl012mno",
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "bearer_token": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.signature",
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
}


def test_each_common_secret_shape_is_replaced_by_its_kind():
    for kind, secret in SECRETS.items():
        redacted = redact_text(f"use {secret} now")
        assert secret not in redacted, kind
        assert f"[REDACTED:{kind}]" in redacted, redacted


def test_text_without_secrets_is_unchanged():
    text = "The skies are clear; ASIA-Pacific region; bearer of news; gh_pages"
    assert redact_text(text) == text


def test_record_text_fields_are_redacted_and_token_fields_are_not():
    key = SECRETS["api_key"]
    rec = make_record("r1", prompt=[11, 22, 33], completion=[44], logprobs=[-0.5],
                      messages=[{"role": "user", "content": [{"type": "text", "text": f"key {key}"}]}],
                      output={"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function",
                           "function": {"name": "login", "arguments": f'{{"token": "{key}"}}'}}]})
    rec.prompt_text = f"prompt {SECRETS['aws_access_key']}"
    out = redact_record(rec)
    flat = repr((out.request_messages, out.output_message, out.prompt_text))
    assert key not in flat and SECRETS["aws_access_key"] not in flat
    assert out.prompt_token_ids == [11, 22, 33]
    assert out.completion_token_ids == [44] and out.completion_logprobs == [-0.5]
    assert key in repr(rec.request_messages), "the caller's record must not be modified"

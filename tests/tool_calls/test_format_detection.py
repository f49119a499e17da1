import pytest

from rollout_server.tiny_model.builder import CHAT_TEMPLATE as TINY_MODEL_TEMPLATE
from rollout_server.tool_calls import FORMATS, format_by_name, format_for_chat_template

# The tool-call part of Qwen3-Coder's template (abridged).
QWEN3_CODER_TEMPLATE = (
    "{%- for tool_call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for args_name, args_value in tool_call.arguments|items %}"
    "{{- '<parameter=' + args_name + '>\\n' }}{{- args_value }}{{- '\\n</parameter>\\n' }}"
    "{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
)
QWEN25_TEMPLATE = (
    "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
)


def test_the_tiny_models_template_is_hermes():
    assert format_for_chat_template(TINY_MODEL_TEMPLATE).name == "hermes"


@pytest.mark.parametrize(("template", "name"), [(QWEN3_CODER_TEMPLATE, "xml_params"), (QWEN25_TEMPLATE, "hermes")])
def test_detection(template, name):
    assert format_for_chat_template(template).name == name


def test_template_without_tool_calls_is_an_error():
    with pytest.raises(LookupError, match="hermes"):
        format_for_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_registry_lists_both_formats_by_name():
    assert {f.name for f in FORMATS} == {"hermes", "xml_params"}
    assert format_by_name("xml_params") is FORMATS[0]
    with pytest.raises(LookupError):
        format_by_name("llama")

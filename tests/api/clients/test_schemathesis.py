"""schemathesis, with every check, finds nothing against a live server: /openapi.json tells the truth.

The server is a stack of this module's own: schemathesis posts deploys, rollbacks, pauses and batches, which would
disturb the tests that share tests/api/conftest.py's stack. Its CLI runs from its own venv (venvs.py).

What no OpenAPI document can state is given to schemathesis as code (HOOKS, a file its CLI loads): what an
uploaded batch input file holds, and that function names of a request's tools do not repeat. And schemathesis does
not put values it read in responses into requests (CONFIG): given the served model's name, a generation request is
served for real, and whether its prompt and max_tokens fit the context window (a 400, as OpenAI answers) is a
count of tokens no schema can state. With any other name, a generation request is validated, then a 404.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rollout_server.generation_routes import GENERATION_ROUTES
from rollout_server.harness.stack import start_stack
from tests.api.clients.venvs import CLIENTS_VENV, client_command

pytestmark = pytest.mark.stack

# Examples per operation and phase: the run takes about a minute on 2 cores, the stack under a minute to start
MAX_EXAMPLES = 100

CONFIG = """
[phases.examples.extra-data-sources]
responses = false
[phases.fuzzing.extra-data-sources]
responses = false
"""

HOOKS = '''
import json

import schemathesis
from hypothesis import strategies as st

# A batch input file (application/jsonl): request lines with unique custom_ids
_LINE = st.fixed_dictionaries({
    "custom_id": st.from_regex(r"\\A[A-Za-z0-9_-]{1,64}\\Z"), "method": st.just("POST"),
    "url": st.sampled_from(["/v1/chat/completions", "/v1/completions"]), "body": st.just({})})
_FILE = st.lists(_LINE, min_size=1, max_size=3, unique_by=lambda line: line["custom_id"])
schemathesis.openapi.media_type("application/jsonl", _FILE.map(lambda lines: "".join(
    json.dumps(line) + "\\n" for line in lines).encode()))


@schemathesis.hook
def before_call(context, case, kwargs):
    """A function name that repeats among the request's tools is renamed."""
    tools = case.body.get("tools") if isinstance(case.body, dict) else None
    functions = [tool.get("function") for tool in tools if isinstance(tool, dict)] if isinstance(tools, list) else []
    seen = set()
    for i, function in enumerate(functions):
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            if name in seen:
                function["name"] = name = f"tool-{i}"
            seen.add(name)
'''


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("schemathesis-stack"), workers=1)
    yield running
    running.stop()


def test_schemathesis_with_every_check_finds_nothing(own_stack, tmp_path):
    st = client_command(CLIENTS_VENV, "st")
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    (tmp_path / "hooks.py").write_text(HOOKS)
    report_dir = tmp_path / "report"
    command = [str(st), "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{own_stack.url}/openapi.json",
               "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", "1",
               "--workers", "1",  # with 2, schemathesis 4.32.5 itself fails (a KeyError in its coverage phase)
               "--request-timeout", "30", "--report", "json", "--report-dir", str(report_dir), "--no-color"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": str(tmp_path / "hooks.py")})
    reports = sorted(report_dir.glob("json-*.json"))
    assert reports, done.stdout[-5000:] + done.stderr[-5000:]
    report = json.loads(reports[-1].read_text())
    failures = done.stdout[done.stdout.find("FAILURES"):][-8000:]  # each with the request to reproduce it
    assert (done.returncode, report["failures"], report["errors"]) == (0, [], []), failures + done.stderr[-3000:]
    assert report["test_cases"]["with_failures"] == 0 and report["operations"]["errored"] == 0
    tested = set(report["valid_rates"])
    assert {f"POST {path}" for path in GENERATION_ROUTES} <= tested, tested

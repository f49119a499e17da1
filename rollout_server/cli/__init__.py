"""`rollout-serve`: start the stack, chat with it, inspect it, manage keys, deploys, traces and the tiny model.

Each command lives in a module of its own here; this one assembles the parser.
"""

from __future__ import annotations

import argparse
import logging
import os

from pydantic import ValidationError

from rollout_server.cli.client import add_client_commands
from rollout_server.cli.deploy import add_deploy_commands
from rollout_server.cli.keys import add_keys_commands
from rollout_server.cli.traces import add_traces_commands
from rollout_server.cli.up import add_up_commands
from rollout_server.cli.usage import add_usage_commands
from rollout_server.cli.worker import add_worker_commands
from rollout_server.database import DatabaseError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-serve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in (add_up_commands, add_client_commands, add_traces_commands, add_usage_commands,
                         add_deploy_commands, add_keys_commands, add_worker_commands):
        add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("ROLLOUT_SERVE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) if hasattr(args, "run") else args.func(args)
    except ValidationError as exc:  # a setting's value, said without it (a database URL holds its password)
        for error in exc.errors(include_input=False):
            location = ".".join(str(part) for part in error["loc"])
            logging.getLogger("rollout_serve").error("setting %s: %s", location, error["msg"])
        return 2
    except DatabaseError as exc:
        logging.getLogger("rollout_serve").error("%s", exc)
        return 1

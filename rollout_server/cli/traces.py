"""`rollout-serve traces ...`: export a team's traces, import verifiers runs.

    rollout-serve traces export --format sft|rl|raw --out DIR --team T [filters]
    rollout-serve traces import-verifiers FILE --team T --model M [--policy-version N]

The store is --store, else the front door's trace directory (rollout_server.settings).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rollout_server.settings import Settings
from rollout_server.times import unix_time
from trace_pipeline.export import FORMATS, export
from trace_pipeline.verifiers_import import import_verifiers


def default_store() -> Path:
    return Settings().trace_dir


def add_traces_commands(subparsers: argparse._SubParsersAction) -> None:
    traces = subparsers.add_parser("traces", help="export and import RL traces")
    commands = traces.add_subparsers(dest="traces_command", required=True)

    exp = commands.add_parser("export", help="write a team's traces as a Parquet dataset")
    exp.add_argument("--format", choices=FORMATS, required=True)
    exp.add_argument("--out", type=Path, required=True, help="output directory (empty or new)")
    exp.add_argument("--team", required=True, help="only this team's traces are exported")
    exp.add_argument("--store", type=Path, default=None, help="trace store directory")
    exp.add_argument("--since", type=unix_time, help="created at or after (unix s or ISO time)")
    exp.add_argument("--until", type=unix_time, help="created before (unix s or ISO time)")
    exp.add_argument("--model")
    exp.add_argument("--policy-version", type=int)
    exp.add_argument("--session", help="one session id")
    exp.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    exp.set_defaults(run=run_export)

    imp = commands.add_parser("import-verifiers", help="store a verifiers traces.jsonl run")
    imp.add_argument("traces_jsonl", type=Path)
    imp.add_argument("--team", required=True)
    imp.add_argument("--model", required=True)
    imp.add_argument("--policy-version", type=int, default=0)
    imp.add_argument("--store", type=Path, default=None)
    imp.set_defaults(run=run_import)


def run_export(args: argparse.Namespace) -> int:
    rows = export(args.store or default_store(), args.out, args.format, args.team,
                  since=args.since, until=args.until, model=args.model,
                  policy_version=args.policy_version, session_id=args.session,
                  progress=not args.no_progress)
    print(f"exported {rows} {args.format} rows to {args.out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    records = import_verifiers(args.store or default_store(), args.traces_jsonl, args.team,
                               args.model, policy_version=args.policy_version)
    print(f"imported {records} records from {args.traces_jsonl}")
    return 0

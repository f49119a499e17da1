"""`rollout-serve traces ...`: export a team's traces, import verifiers runs.

    rollout-serve traces export --format sft|rl|raw --out DIR --team T [filters]
    rollout-serve traces import-verifiers FILE --team T --model M [--policy-version N]

The store is --store, else the front door's trace directory (rollout_server.settings); its sealed files are
where --sealed-uri says, else traces.sealed_uri (environment: ROLLOUT_SERVE_TRACES__SEALED_URI, with
ROLLOUT_SERVE_TRACES__S3__* or the AWS variables for an s3:// one), else under the store.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rollout_server.settings import Settings
from rollout_server.times import unix_time
from trace_pipeline.export import FORMATS, export
from trace_pipeline.store import TraceStore
from trace_pipeline.verifiers_import import import_verifiers


def open_store(args: argparse.Namespace, *, existing: bool) -> TraceStore:
    """The store --store and --sealed-uri name, over the settings (environment, defaults); existing: refuse a
    directory that holds no store yet (an export would find nothing in it)."""
    settings = Settings()
    store_dir = args.store or settings.trace_dir
    if existing and not store_dir.is_dir():
        raise FileNotFoundError(f"no trace store at {store_dir}")
    traces = settings.traces
    if args.sealed_uri is not None:
        traces = traces.model_validate(traces.model_dump() | {"sealed_uri": args.sealed_uri})
    return TraceStore.from_settings(traces, root=store_dir)


def add_traces_commands(subparsers: argparse._SubParsersAction) -> None:
    traces = subparsers.add_parser("traces", help="export and import RL traces")
    commands = traces.add_subparsers(dest="traces_command", required=True)

    exp = commands.add_parser("export", help="write a team's traces as a Parquet dataset")
    exp.add_argument("--format", choices=FORMATS, required=True)
    exp.add_argument("--out", type=Path, required=True, help="output directory (empty or new)")
    exp.add_argument("--team", required=True, help="only this team's traces are exported")
    exp.add_argument("--store", type=Path, default=None, help="trace store directory")
    exp.add_argument("--sealed-uri", default=None, help="where its sealed files are: a directory or "
                     "s3://bucket/prefix (default: traces.sealed_uri, else under the store)")
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
    imp.add_argument("--sealed-uri", default=None, help="as for export")
    imp.set_defaults(run=run_import)


def run_export(args: argparse.Namespace) -> int:
    rows = export(open_store(args, existing=True), args.out, args.format, args.team,
                  since=args.since, until=args.until, model=args.model,
                  policy_version=args.policy_version, session_id=args.session,
                  progress=not args.no_progress)
    print(f"exported {rows} {args.format} rows to {args.out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    records = import_verifiers(open_store(args, existing=False), args.traces_jsonl, args.team,
                               args.model, policy_version=args.policy_version)
    print(f"imported {records} records from {args.traces_jsonl}")
    return 0

"""`rollout-serve usage`: usage totals read straight from the database (no server needed)."""

from __future__ import annotations

import argparse
import csv
import io
import json

from rollout_server.auth import open_database
from rollout_server.cli.settings_flags import add_state_arguments, state_settings_from_args
from rollout_server.times import unix_time
from rollout_server.usage import GROUP_BY_FIELDS, UsageQuery, UsageRow, UsageStore, parse_group_by


def add_usage_commands(subparsers: argparse._SubParsersAction) -> None:
    usage = subparsers.add_parser("usage", help="usage totals per team, key, model, pool and day",
                                  description="Reads the usage table directly (no server needed).")
    usage.add_argument("--team", help="only this team (default: every team)")
    usage.add_argument("--key", help="only this key prefix")
    usage.add_argument("--model", help="only this model")
    usage.add_argument("--since", type=unix_time, help="from this time (unix s or ISO 8601, UTC by default)")
    usage.add_argument("--until", type=unix_time, help="before this time (unix s or ISO 8601)")
    usage.add_argument("--group-by", default="team,model,day", help=f"comma-separated: {', '.join(GROUP_BY_FIELDS)}")
    usage.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_state_arguments(usage)
    usage.set_defaults(func=run_usage_command)


def run_usage_command(args: argparse.Namespace) -> int:
    try:
        group_by = parse_group_by([args.group_by])
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    store = UsageStore(open_database(state_settings_from_args(args).state.resolved_database_url))
    query = UsageQuery(team=args.team, key_prefix=args.key, model=args.model, since=args.since,
                       until=args.until, group_by=group_by)
    print(format_usage(store.totals(query), group_by, args.format), end="")
    return 0


_COUNT_COLUMNS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens", "wall_s")


def format_usage(rows: list[UsageRow], group_by: tuple[str, ...], fmt: str) -> str:
    records = [row.to_json() for row in rows]
    if fmt == "json":
        return json.dumps(records, indent=2) + "\n"
    columns = list(group_by) + list(_COUNT_COLUMNS)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return out.getvalue()
    return _table(columns, records)


def _table(columns: list[str], records: list[dict]) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    cells = [[cell(record[c]) for c in columns] for record in records]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(text.ljust(w) for text, w in zip(columns, widths))]
    lines += ["  ".join(text.ljust(w) for text, w in zip(row, widths)) for row in cells]
    return "\n".join(lines) + "\n"

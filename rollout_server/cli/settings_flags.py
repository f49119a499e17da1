"""The settings tree (rollout_server/settings.py) on the command line: one flag per field, grouped by section.

A flag left out falls back to the environment, then to the field's default; `--help` shows each field's
description and default under its section.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

from rollout_server.settings import (
    ENV_PREFIX,
    PREFIXED_SECTIONS,
    SETTINGS_NAMES,
    Settings,
    StateSettings,
    nest_short_names,
)


def _scalar_type(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return str, list(typing.get_args(annotation))
    return (annotation if annotation in (int, float, str, bool, Path) else str), None


def _section_title(path: tuple[str, ...]) -> str:
    """A group's title, e.g. `engine.kv_tier settings (environment: ROLLOUT_SERVE_KV_TIER__<FIELD>, ...)`."""
    section = path[:-1]
    names = [] if any(part in PREFIXED_SECTIONS for part in section) else [f"{ENV_PREFIX}<FIELD>"]
    if len(section) > 1:
        names.append(f"{ENV_PREFIX}{section[-1].upper()}__<FIELD>")
    names.append(ENV_PREFIX + "__".join(section).upper() + "__<FIELD>")
    return f"{'.'.join(section)} settings (environment: {', '.join(names)})"


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field of the tree, documented by the field itself."""
    groups: dict[tuple[str, ...], argparse._ArgumentGroup] = {}
    for setting in SETTINGS_NAMES:
        section = setting.path[:-1]
        if section not in groups:
            groups[section] = parser.add_argument_group(_section_title(setting.path))
        field = setting.field
        kind, choices = _scalar_type(field.annotation)
        default = field.default if field.default_factory is None else field.default_factory()
        help_text = f"{field.description or ''} (default: {default})".lstrip()
        if kind is bool:
            groups[section].add_argument(setting.flag, dest=setting.name, action=argparse.BooleanOptionalAction,
                                         default=None, help=help_text)
        else:
            groups[section].add_argument(setting.flag, dest=setting.name, type=kind, choices=choices, default=None,
                                         help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings the flags given name, over the environment and the defaults."""
    given = {s.name: getattr(args, s.name) for s in SETTINGS_NAMES if getattr(args, s.name, None) is not None}
    return Settings(**nest_short_names(given))


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of commands that read the state database directly, with no server (keys, usage)."""
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in the state directory)")
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)


def state_settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings those flags name (the state section's), over the environment and the defaults."""
    return Settings(**{name: getattr(args, name) for name in StateSettings.model_fields if getattr(args, name, None)})

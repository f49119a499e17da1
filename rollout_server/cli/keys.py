"""`rollout-serve keys create | list | revoke | limit`: API keys, straight in the database (no server needed)."""

from __future__ import annotations

import argparse
import sys

from rollout_server.auth import KeyStore, open_database
from rollout_server.cli.settings_flags import add_state_arguments, state_settings_from_args
from rollout_server.quotas import KeyLimitStore


def add_keys_commands(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="API keys (stored hashed)").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key for a team and print it once")
    create.add_argument("--team", required=True)
    create.add_argument("--name")
    create.add_argument("--admin", action="store_true", help="may deploy checkpoints and update weights")
    create.set_defaults(func=cmd_keys_create)
    listing = keys.add_parser("list", help="list keys (prefixes only)")
    listing.add_argument("--team")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke keys by prefix (a running server refuses them within "
                                            "keys_recheck_s, 2 s by default)")
    revoke.add_argument("prefix", help="the key's prefix (rollout-serve keys list), its first 10 characters")
    revoke.set_defaults(func=cmd_keys_revoke)
    limit = keys.add_parser("limit", help="set a key's rate limits (429 with Retry-After beyond them)")
    limit.add_argument("prefix", help="the key's prefix (rollout-serve keys list), its first 10 characters")
    limit.add_argument("--requests-per-min", type=int, help="requests per minute (unset: the server default; 0: none)")
    limit.add_argument("--tokens-per-min", type=int, help="prompt + completion tokens per minute (unset: default; 0: none)")
    limit.set_defaults(func=cmd_keys_limit)
    for p in (create, listing, revoke, limit):
        add_state_arguments(p)


def _key_store(args):
    return KeyStore(open_database(state_settings_from_args(args).state.resolved_database_url))


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        key = _key_store(args).create(args.team, name=args.name, is_admin=args.admin)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"created a key for team {args.team!r}; it is shown only once", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    for row in _key_store(args).list(args.team):
        print(f"{row['key_prefix']}…  team={row['team']}  name={row['name'] or '-'}  admin={row['is_admin']}  "
              f"revoked={row['revoked']}")
    return 0


def cmd_keys_limit(args: argparse.Namespace) -> int:
    settings = state_settings_from_args(args)
    KeyLimitStore(open_database(settings.state.resolved_database_url)).set(args.prefix, args.requests_per_min,
                                                                     args.tokens_per_min)
    print(f"key {args.prefix}: {args.requests_per_min or 'default'} requests/min, "
          f"{args.tokens_per_min or 'default'} tokens/min (a running server applies it within "
          f"{settings.quotas.limits_cache_s:.0f} s)")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    count = _key_store(args).revoke(args.prefix)
    print(f"revoked {count} key(s)")
    return 0 if count else 1

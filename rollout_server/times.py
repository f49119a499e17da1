"""Times given on the command line or in query strings."""

from __future__ import annotations

import datetime as dt


def unix_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 date/time (UTC when no zone is given)."""
    try:
        return float(text)
    except ValueError:
        moment = dt.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.timezone.utc)
        return moment.timestamp()

"""Times given on the command line or in query strings."""

from __future__ import annotations

import datetime as dt
import math

# Year 1 to 9999: what a datetime (and so every date the stores group by) can hold
_EARLIEST = dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc).timestamp()
_LATEST = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone.utc).timestamp()


def unix_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 date/time (UTC when no zone is given); ValueError otherwise."""
    try:
        seconds = float(text)
    except ValueError:
        moment = dt.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.timezone.utc)
        return moment.timestamp()
    if not (math.isfinite(seconds) and _EARLIEST <= seconds <= _LATEST):
        raise ValueError(f"{text!r} is not a time between the years 1 and 9999")
    return seconds

"""Team isolation in the engine: what one team's requests can share with another's, and what they never can.

The rules, applied to every engine request in one place (`TeamScope.scope`, called by Generation):
- Cached KV is shared only within a cache group: a team on its own, or the teams of one `kv_share_groups` entry
  (server settings). Every engine request carries its group's salt, an HMAC of the group's teams under the
  server's `kv_salt_secret` (so no caller can compute another group's salt from team names), followed by the
  client's own `cache_salt` if it sent one. vLLM's prefix cache, the KV router's block hashes and the KV tier's
  keys all take the request's salt, so all three are namespaced by group: a team cannot learn from
  `cached_tokens` (or from a faster first token) that another team sent a prompt.
- Sessions and request ids belong to their team: the engine gets them scoped by team (`team_scoped`), so team A's
  session "s1" and team B's "s1" are two sessions (two pins, two deployment slots, two session prompts), and a
  client's request id can never name another team's request (its quota reservation, its engine stream).
  Clients see their own ids unchanged: responses, usage and traces carry the client's ids and salt, never the
  scoped ones or the derived salt.
- A client-chosen request id already running for its team is refused (409 naming `request_id`): two requests
  under one id would share one quota reservation, and the second's end would close the first's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

from engine.contract import EngineRequest
from rollout_server.errors import APIError
from rollout_server.settings import ServerSettings


def team_scoped(team: str, name: str) -> str:
    """`name` (a session or request id) as the team's own: the team's length first, so that no pair of team and
    name (both any text) reads as another pair."""
    return f"{len(team)}:{team}/{name}"


class TeamScope:
    """The server's cache groups and their salts, and the request ids running per team."""

    def __init__(self, secret: bytes, share_groups: list[list[str]]):
        self._secret = secret
        self._group_of = {team: sorted(group) for group in share_groups for team in group}
        self._salts: dict[str, str] = {}   # team -> its group's salt (a few teams: never evicted)
        self._running: set[str] = set()    # team-scoped ids of the requests between admission and their end

    @classmethod
    def from_settings(cls, server: ServerSettings) -> TeamScope:
        # Without a configured secret, one made for this process: every cache it salts (the workers' prefix
        # caches, the KV tier) starts and ends with the stack this process runs.
        secret = server.kv_salt_secret.encode() if server.kv_salt_secret else secrets.token_bytes(32)
        return cls(secret, server.kv_share_groups)

    def cache_salt(self, team: str, client_salt: str | None) -> str:
        """The salt an engine request of `team` carries: its group's, then the client's own (the group's salt has
        a fixed length, so no client salt makes one group's salt read as another's)."""
        salt = self._salts.get(team)
        if salt is None:
            group = json.dumps(self._group_of.get(team, [team]))
            salt = self._salts[team] = hmac.new(self._secret, group.encode(), hashlib.sha256).hexdigest()
        return f"{salt}/{client_salt}" if client_salt else salt

    def scope(self, req: EngineRequest, team: str) -> None:
        """Puts the client's request, as the front door built it, in its team's namespace (in place)."""
        req.request_id = team_scoped(team, req.request_id)
        if req.session_id:
            req.session_id = team_scoped(team, req.session_id)
        req.cache_salt = self.cache_salt(team, req.cache_salt)

    def claim(self, scoped_request_id: str, client_request_id: str) -> None:
        """Marks a request running, or refuses it when its team already runs one under that id (409)."""
        if scoped_request_id in self._running:
            raise APIError(409, f"a request with request_id {client_request_id!r} is already running; "
                                "give each running request an id of its own", param="request_id",
                           code="request_id_in_use")
        self._running.add(scoped_request_id)

    def release(self, scoped_request_id: str) -> None:
        self._running.discard(scoped_request_id)

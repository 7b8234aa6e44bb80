"""Every Redis key the daemon writes, built in one place.

All keys of a session share the hash tag `{<session key>}` so that on Redis Cluster they live in
one slot and a session's pipeline or script never crosses nodes. The key is the session id, under
its tenant for a tenant's session (`acme/call-42`, `Caller.session_key`); session ids and tenant
names are validated at the API edge to exclude `{` and `}`, so the tag is always exactly the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered_memory.model import SessionKey


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builders under one prefix (`REDIS_KEY_PREFIX`, default `tm`), so that several
    deployments or test runs can share one Redis without touching each other's keys."""

    prefix: str = "tm"

    def recent(self, key: SessionKey) -> str:
        """List of the most recent messages (JSON), oldest first, trimmed on every push."""
        return f"{self.prefix}:{{{key}}}:recent"

    def summary(self, key: SessionKey) -> str:
        """The current summary (JSON)."""
        return f"{self.prefix}:{{{key}}}:summary"

    def state(self, key: SessionKey) -> str:
        """Hash: turn count, message count and last activity as SQL last reported them."""
        return f"{self.prefix}:{{{key}}}:state"

    def state_floor(self, key: SessionKey) -> str:
        """The newest version of the gateway's state put in the hot tier (PUT_STATE_LUA): a refill
        never caches an older one. Apart from `state`, whose loss must not take it along."""
        return f"{self.prefix}:{{{key}}}:state-floor"

    def lock(self, name: str) -> str:
        """Summarization lock: one summarizer per session across every replica."""
        return f"{self.prefix}:{{{name}}}:lock"

    def recall(self, key: SessionKey) -> str:
        """Hash: the session's recall postings and the messages they point at (postings.py).
        Named for the form of its terms (`s2`: English words as Snowball stems): postings of
        another form are never searched, and expire with their TTL."""
        return f"{self.prefix}:{{{key}}}:recall-s2"

    def recall_floor(self, key: SessionKey) -> str:
        """When the session's recall postings were last forgotten (deleted, or its messages
        changed): a batch read before that is refused (tiers/redis/postings.py)."""
        return f"{self.prefix}:{{{key}}}:recall-floor"

    def rebuild(self, key: SessionKey, job_id: str) -> str:
        """One rebuild job's record (JSON): every job of a session under its own id, so that a
        later job never hides an earlier one's answer from whoever polls it (rebuilds.py)."""
        return f"{self.prefix}:{{{key}}}:rebuild:{job_id}"

    def rebuild_lease(self, key: SessionKey) -> str:
        """The id of the session's live rebuild job, expiring unless its process renews it: one
        rebuild per session across replicas, and a job whose process died is seen to be lost."""
        return f"{self.prefix}:{{{key}}}:rebuild-lease"

    def rate(self, name: str) -> str:
        """Hash: a token bucket (`tenant:<name>` or `token:<id>`) every replica draws on."""
        return f"{self.prefix}:rate:{{{name}}}"

    def all_of(self, key: SessionKey) -> tuple[str, ...]:
        return (
            self.recent(key),
            self.summary(key),
            self.state(key),
            self.state_floor(key),
            self.lock(key),
            self.recall(key),
        )

    def pattern(self) -> str:
        """SCAN pattern matching every key under this prefix (tests and admin tools)."""
        return f"{self.prefix}:*"

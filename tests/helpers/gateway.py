"""A gateway's conversation against daemon processes on real Redis and MariaDB, as the crash,
failover and replica tests drive it, and what they read back from SQL."""

from __future__ import annotations

import aiohttp

from tests.helpers.servers import RealServers, sql_rows
from tiered_memory.testing import FakeLlm


def crash_env(real_servers: RealServers, prefix: str, llm: FakeLlm, **extra: str) -> dict[str, str]:
    """A daemon process's environment on the real servers under `prefix`, summarizing with `llm`
    every third turn and sweeping often, logging JSON; `extra` over it."""
    return {
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "LLM_BASE_URL": llm.url,
        "SUMMARY_MODEL": "fake",
        "SUMMARY_FORMAT": "text",
        "SUMMARY_EVERY_N_TURNS": "3",
        "SWEEP_INTERVAL_SECONDS": "0.5",
        "LOG_FORMAT": "json",  # the log is read as JSON lines
    } | extra


class Gateway:
    """One conversation as a gateway drives it: turns in order, each message retried with its
    message_id until the daemon acknowledges it; `acked` is what the daemon acknowledged."""

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.acked: list[str] = []
        self.pending: tuple[str, str, str] | None = None  # message_id, role, content

    def message(self, turn: int, role: str) -> tuple[str, str, str]:
        text = f"«{self.sid}» 第{turn}轮{'问题' if role == 'user' else '回答'}：编号{turn * 7 + 3}"
        return f"{self.sid}-{turn}-{role}", role, text

    async def send(self, http: aiohttp.ClientSession, base_url: str, message: tuple[str, str, str]) -> bool:
        """One attempt; True when acknowledged."""
        message_id, role, content = message
        self.pending = message
        body = {"role": role, "content": content, "message_id": message_id}
        try:
            async with http.post(f"{base_url}/v1/sessions/{self.sid}/messages", json=body) as resp:
                if resp.status not in (200, 201):
                    return False
        except (aiohttp.ClientError, TimeoutError):
            return False
        self.acked.append(message_id)
        self.pending = None
        return True


def stored_ids(real_servers: RealServers, sid: str) -> list[str]:
    query = "SELECT message_id FROM messages WHERE session_id=%s ORDER BY seq"
    return [r[0] for r in sql_rows(real_servers.mysql_url, query, sid)]


def covered_turns(real_servers: RealServers, sid: str) -> int:
    rows = sql_rows(real_servers.mysql_url, "SELECT covered_turns FROM conversation_summaries WHERE session_id=%s", sid)
    return int(rows[0][0]) if rows else 0


def turn_count(real_servers: RealServers, sid: str) -> int:
    return int(sql_rows(real_servers.mysql_url, "SELECT turn_count FROM sessions WHERE session_id=%s", sid)[0][0])

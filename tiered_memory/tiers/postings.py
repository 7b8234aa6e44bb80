"""Recall postings: each session's search terms and the messages they point at, kept in the hot
tier so that every replica reads the same index (Redis: one hash per session, tiers/redis/postings.py;
the embedded default: process memory, below).

A session's postings grow by batches of consecutive messages, only at the end: a batch whose
first seq is not one past the last indexed changes nothing (a retry, a batch another replica
already added, or postings lost with the hot tier: the next question catches them up from SQL).
They are bounded in bytes per session: a batch that would pass the bound marks them full, and
they stay as they are (questions search the part indexed; the newest turns are the context's
window anyway). Like everything in the hot tier they may be lost at any moment; SQL's messages
are the source they are rebuilt from.

Layout, the same in both backends: `t:<term>` holds one 8-byte entry per message containing the
term (seq, term frequency, the message's length in terms), in seq order; `d:<seq>` the message
(`encode_doc`), for answered messages only (a stopped or failed reply is never
shown, so never recalled).
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from tiered_memory.lru import Lru
from tiered_memory.model import Channel, Message, MessageStatus, Role, SessionKey, key_tenant

ENTRY = struct.Struct("<IHH")
"""One posting: seq, the term's frequency in the message, the message's length in terms."""

STALE = -1
"""What `add` answers for a batch read before the session's postings were forgotten."""

SESSION_BYTES = 8 * 2**20
"""RECALL_MAX_BYTES's default: a session's postings bound, about 10,000 turns of short messages."""

# Longer terms (a URL, a run of digits) are cut: they still match themselves.
_TERM_MAX = 64
_U16 = 0xFFFF
# Forgotten sessions whose time of forgetting the process memory keeps (a catch-up in flight
# for an older one finishes long before this many more are deleted).
_FLOORS = 100_000


def term_key(term: str) -> str:
    """A search term as the postings key it: cut to 64 characters (a URL, a run of digits), the
    same when stored and when asked."""
    return term[:_TERM_MAX]


def term_field(term: str) -> str:
    return "t:" + term_key(term)


def doc_field(seq: int) -> str:
    return f"d:{seq}"


@dataclass(frozen=True, slots=True)
class PostingsBatch:
    """Consecutive messages of one session (`first_seq`..`last_seq`), packed for `add`: the
    entries to append to each term, the messages to keep, and what they add to the counters."""

    first_seq: int
    last_seq: int
    docs: int
    terms: int
    postings: dict[str, bytes]
    messages: dict[int, bytes]
    read_at: float
    """When the messages were read from SQL (or committed, for appends), epoch seconds: a batch
    read before the session was deleted or changed (`forget`) is refused."""

    @property
    def size(self) -> int:
        """Bytes the batch adds, as the bound counts them: every field name and value."""
        return sum(len(t.encode("utf-8")) + 2 + len(v) for t, v in self.postings.items()) + sum(
            len(doc_field(s)) + len(v) for s, v in self.messages.items()
        )


def pack(messages: Sequence[Message], terms: Sequence[Sequence[str]], *, read_at: float) -> PostingsBatch:
    """The batch of `messages` (consecutive, oldest first) with each one's search `terms`, read
    from SQL (or committed) at `read_at`."""
    if not messages:
        raise ValueError("a postings batch needs at least one message")
    postings: dict[str, bytearray] = {}
    docs: dict[int, bytes] = {}
    total = 0
    for m, said in zip(messages, terms, strict=True):
        if not m.answered:
            continue
        docs[m.seq] = encode_doc(m)
        total += len(said)
        counts: dict[str, int] = {}
        for term in said:
            key = term_key(term)
            counts[key] = counts.get(key, 0) + 1
        length = min(len(said), _U16)
        for term, tf in counts.items():
            postings.setdefault(term, bytearray()).extend(ENTRY.pack(m.seq, min(tf, _U16), length))
    return PostingsBatch(
        first_seq=messages[0].seq,
        last_seq=messages[-1].seq,
        docs=len(docs),
        terms=total,
        postings={t: bytes(v) for t, v in postings.items()},
        messages=docs,
        read_at=read_at,
    )


class Tokenizer(Protocol):
    def search_terms_of(self, texts: Sequence[str]) -> list[list[str]]: ...


def packed(tokenizer: Tokenizer, messages: list[Message], read_at: float) -> PostingsBatch:
    """`pack` with the messages' search terms: a recall catch-up's part, run by a text worker.
    Packing there too keeps the catch-up's words off the event loop both ways (512 KB of text
    is some 170,000 terms, which the serving process would unpickle and walk for tens of
    milliseconds, against a few thousand packed postings). It lives here, not with its caller:
    a worker imports the module of the function it is sent at its first call, and the history's
    module would bring SQLAlchemy with it, half a second that a question waiting on its
    catch-up would wait too."""
    return pack(messages, tokenizer.search_terms_of([m.content for m in messages]), read_at=read_at)


def packed_each(tokenizer: Tokenizer, messages: list[Message]) -> list[PostingsBatch]:
    """Each appended message's batch alone, read when it was committed: the appends' part, run by
    a text worker as `packed` is for a catch-up. A 32 KB message is some 10,000 terms, which
    the serving process took 40 to 50 ms to unpickle and pack on the event loop (seen in the
    tenant soak); its batch is a few thousand postings, merged there in a few."""
    terms = tokenizer.search_terms_of([m.content for m in messages])
    return [pack([m], [said], read_at=m.created_at) for m, said in zip(messages, terms, strict=True)]


def merged(batches: Sequence[PostingsBatch]) -> PostingsBatch:
    """Batches of consecutive messages, in seq order, as one batch."""
    if len(batches) == 1:
        return batches[0]
    postings: dict[str, bytearray] = {}
    for b in batches:
        for term, entries in b.postings.items():
            postings.setdefault(term, bytearray()).extend(entries)
    return PostingsBatch(
        first_seq=batches[0].first_seq,
        last_seq=batches[-1].last_seq,
        docs=sum(b.docs for b in batches),
        terms=sum(b.terms for b in batches),
        postings={t: bytes(v) for t, v in postings.items()},
        messages={seq: doc for b in batches for seq, doc in b.messages.items()},
        read_at=min(b.read_at for b in batches),
    )


@dataclass(frozen=True, slots=True)
class PostingsRead:
    """What a search reads: the counters BM25 needs and the postings of the asked terms (a term
    no message holds is absent). `last_seq` 0: nothing indexed."""

    last_seq: int
    docs: int
    total_terms: int
    full: bool
    postings: dict[str, bytes] = field(default_factory=dict)
    doc: Message | None = None
    """The message asked for with the read, when the postings keep it."""


def entries(data: bytes) -> Iterator[tuple[int, int, int]]:
    """The (seq, term frequency, message length) entries of one term's postings."""
    return ENTRY.iter_unpack(data)


def encode_doc(m: Message) -> bytes:
    """A message as its `d:<seq>` field keeps it: a JSON array without the session id and seq
    (the key and the field name hold them) or the field names, half the recent list's encoding;
    a tool call or result adds its three fields."""
    doc = [m.turn, m.role.value, m.content, m.message_id, m.created_at, m.user_id, m.channel.value, m.status.value]
    if m.tool_calls or m.tool_call_id is not None:
        doc += [m.tool_calls, m.tool_call_id, m.name]
    return orjson.dumps(doc)


def decode_doc(key: SessionKey, seq: int, data: bytes) -> Message:
    """The message of `encode_doc`; ValueError, TypeError or KeyError when `data` is not one."""
    turn, role, content, message_id, created_at, user_id, channel, status, *tool = orjson.loads(data)
    tool_calls, tool_call_id, name = tool or ("", None, None)
    return Message(
        key=key,
        seq=seq,
        turn=int(turn),
        role=Role(role),
        content=str(content),
        message_id=str(message_id),
        created_at=float(created_at),
        user_id=None if user_id is None else str(user_id),
        channel=Channel(channel),
        status=MessageStatus(status),
        tool_calls=str(tool_calls),
        tool_call_id=None if tool_call_id is None else str(tool_call_id),
        name=None if name is None else str(name),
    )


class PostingsStore(Protocol):
    """Where the postings live. Every method is one round trip; a backend that fails raises
    HotUnavailable, like the hot tier it belongs to."""

    async def read(self, key: SessionKey, terms: Sequence[str], *, doc: int | None = None) -> PostingsRead:
        """The counters, the postings of `terms` (empty: the counters only) and the message at seq
        `doc` (to check that the postings are the session's)."""
        ...

    async def messages(self, key: SessionKey, seqs: Sequence[int]) -> dict[int, Message]:
        """The indexed messages among `seqs`, by seq."""
        ...

    async def add(self, key: SessionKey, batch: PostingsBatch) -> int:
        """Append `batch` if it continues the postings and keeps them within the session's bound
        (else mark them full); the last seq indexed afterwards, or STALE when the batch was read
        before the session's postings were last forgotten."""
        ...

    async def forget(self, key: SessionKey) -> None:
        """Drop the session's postings, and refuse every batch read before now (a catch-up or an
        append in flight would put the old messages back)."""
        ...


@dataclass(slots=True)
class _Session:
    last_seq: int = 0
    docs: int = 0
    terms: int = 0
    size: int = 0
    full: bool = False
    postings: dict[str, bytearray] = field(default_factory=dict)
    messages: dict[int, bytes] = field(default_factory=dict)


class MemoryPostings:
    """PostingsStore in process memory, for the embedded default: the sessions' postings in
    all bounded by `max_bytes` (as the bound counts them: names and values), the least recently
    used session dropped first; the newest stays even alone over the bound. One tenant's are
    bounded by `tenant_max_bytes` (0: none) the same way, its own sessions dropped first; one
    session's by `session_max_bytes`."""

    def __init__(
        self,
        *,
        max_bytes: int,
        session_max_bytes: int,
        tenant_max_bytes: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._max = max_bytes
        self._session_max = session_max_bytes
        self._tenant_max = tenant_max_bytes
        # Each tenant's sessions in the order they were last used, and the bytes they hold.
        self._tenants: dict[str, OrderedDict[str, None]] = {}
        self._tenant_size: dict[str, int] = {}
        self._clock = clock
        # When each forgotten session was forgotten (the newest _FLOORS of them): a batch read
        # before that is refused.
        self._floors: Lru[str, float] = Lru(_FLOORS)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def _get(self, key: SessionKey) -> _Session | None:
        found = self._sessions.get(key)
        if found is not None:
            self._sessions.move_to_end(key)
            tenant = key_tenant(key)
            if tenant:
                self._tenants[tenant].move_to_end(key)
        return found

    def _put(self, key: SessionKey) -> _Session:
        found = self._sessions[key] = _Session()
        tenant = key_tenant(key)
        if tenant:
            self._tenants.setdefault(tenant, OrderedDict())[key] = None
        return found

    def _grew(self, key: SessionKey, size: int) -> None:
        self._size += size
        tenant = key_tenant(key)
        if tenant:
            self._tenant_size[tenant] = self._tenant_size.get(tenant, 0) + size

    def _remove(self, key: str) -> None:
        gone = self._sessions.pop(key)
        self._size -= gone.size
        tenant = key_tenant(key)
        if tenant:
            mine = self._tenants[tenant]
            del mine[key]
            self._tenant_size[tenant] -= gone.size
            if not mine:
                del self._tenants[tenant], self._tenant_size[tenant]

    def _shed(self, key: SessionKey) -> None:
        """Drop the least recently used sessions past the bounds, never `key` itself: the
        tenant's own for its bound, then anyone's for the total."""
        tenant = key_tenant(key)
        if tenant and self._tenant_max:
            mine = self._tenants[tenant]
            while self._tenant_size[tenant] > self._tenant_max and len(mine) > 1:
                self._remove(next(k for k in mine if k != key))
        while self._size > self._max and len(self._sessions) > 1:
            self._remove(next(k for k in self._sessions if k != key))

    async def read(self, key: SessionKey, terms: Sequence[str], *, doc: int | None = None) -> PostingsRead:
        found = self._get(key)
        if found is None:
            return PostingsRead(0, 0, 0, False)
        keys = {term_key(t) for t in terms}
        postings = {t: bytes(found.postings[t]) for t in keys if t in found.postings}
        kept = found.messages.get(doc) if doc is not None else None
        message = decode_doc(key, doc, kept) if doc is not None and kept is not None else None
        return PostingsRead(found.last_seq, found.docs, found.terms, found.full, postings, message)

    async def messages(self, key: SessionKey, seqs: Sequence[int]) -> dict[int, Message]:
        found = self._get(key)
        if found is None:
            return {}
        return {s: decode_doc(key, s, found.messages[s]) for s in seqs if s in found.messages}

    async def add(self, key: SessionKey, batch: PostingsBatch) -> int:
        floor = self._floors.get(key)
        if floor is not None and batch.read_at < floor:
            return STALE
        found = self._get(key)
        if found is None:
            if batch.first_seq != 1:
                return 0  # an entry only for postings that start at the session's start
            found = self._put(key)
        if found.full or batch.first_seq != found.last_seq + 1:
            return found.last_seq
        size = batch.size
        if found.size + size > self._session_max:
            found.full = True
            return found.last_seq
        for term, data in batch.postings.items():
            found.postings.setdefault(term, bytearray()).extend(data)
        found.messages.update(batch.messages)
        found.last_seq = batch.last_seq
        found.docs += batch.docs
        found.terms += batch.terms
        found.size += size
        self._grew(key, size)
        self._shed(key)
        return found.last_seq

    async def forget(self, key: SessionKey) -> None:
        self.drop(key)

    def clear(self) -> None:
        self._sessions.clear()
        self._tenants.clear()
        self._tenant_size.clear()
        self._size = 0

    def drop(self, key: SessionKey, *, changed_seq: int = 0) -> bool:
        """forget, for a caller outside the event loop's tasks; with `changed_seq`, only postings
        that reach that message go (HotTier.invalidate), though a batch read before now is refused
        either way. Whether they went."""
        self._floors.put(key, self._clock())
        found = self._sessions.get(key)
        if found is None or found.last_seq < changed_seq:
            return False
        self._remove(key)
        return True

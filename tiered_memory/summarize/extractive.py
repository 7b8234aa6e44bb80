"""The deterministic summarizer: keeps what later turns refer back to, within a character budget.

It is the fallback when the LLM is down and the cold tier's answer from raw messages, so it must be
general (Chinese and English, no dataset-tuned word lists) and cheap. It keeps, by priority: the
user's identity, preferences and constraints; sentences carrying numbers (doses, prices, dates,
phone numbers) or named entities, whoever said them; the user's questions. Named entities come from
jieba's part-of-speech tags and word frequencies, numbers and questions from regular expressions.
Early facts are preferred to late ones when the budget runs out: the recent turns are in the hot
tier anyway, and the point of memory is that early things survive.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_memory.model import Message, Role
from tiered_memory.prompt.facts import (
    CJK,
    EVENT,
    FACT,
    LATIN,
    NOT_WORD,
    PROFILE,
    QUESTION,
    State,
    lead,
    render_items,
)
from tiered_memory.text.condense import clauses, condense, is_phatic, strip_stamp

_ITEM_CHARS = 80  # one kept sentence at most; longer ones are clipped around their first number
_CHUNK_CHARS = 60  # comma-only voice transcripts are re-cut into clauses of about this size
_KEEP_FACTOR = 2  # `structured` keeps 2x the rendered budget, so later merges still have material
_SUBJECT_CHARS = 60  # the conversation's subject line at most
_COMMON_NAME_FREQ = 1000

_PROPER_TAGS = frozenset({"nr", "nrt", "nrfg", "ns", "nt", "nz"})
_NOUN_TAGS = frozenset({"n", "nw", "vn"})

_SENTENCE_END = re.compile(r"(?<=[。！？!?；;\n])|(?<=[.…])\s+")
_CLAUSE_END = re.compile(r"(?<=[，,、：:])")
_SPACES = re.compile(r"\s+")
_NUMERAL = re.compile(r"\d+(?:[.,:]\d+)*")
_NUMBER = re.compile(
    r"\d|[零一二两三四五六七八九十百千万半]+(?:个月|个小时|次|条|粒|片|袋|盒|瓶|支|包|克|斤|公斤|块钱|元|岁|天|周"
    r"|年|小时|分钟|人|份|杯|碗|张|件|台|套|箱|罐|颗|勺|顿|倍|折)"
    r"|\b(?:once|twice|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty"
    r"|forty|fifty|hundred|thousand|million|dozen)\b",
    re.IGNORECASE,
)
# Self-description, likes and constraints; matched on the user's sentences only.
PROFILE_MARK = re.compile(
    r"我(?:叫|姓|的名字)|名字[是叫]|叫我|我是(?![想说问要不在])|我(?:今年|已经)?[\d一二三四五六七八九十]+岁"
    r"|我(?:住在|家在|在.{1,8}(?:工作|上班|上学|读书))|我的(?:电话|手机|邮箱|地址|生日|身份证|证件|账号|车牌)"
    r"|我的?(?:妈妈|妈|爸爸|爸|父母|老公|老婆|丈夫|妻子|孩子|儿子|女儿|宝宝|家人)"
    r"|我(?:比较|很|最|更|特别|非常|一直|不太|不|也|只|还是)?(?:喜欢|爱吃|爱喝|讨厌|怕|偏好|习惯|想要|需要|希望)"
    r"|不要|别太|不(?:太|怎么|大)?(?:能|敢|爱|喜欢)?[吃喝]|忌口|过敏|吃素|怀孕|预算|尽量|宁[愿可]|口味"
    r"|\bmy name\b|\bcall me\b|\bi(?:'m| am) (?:a|an|\d+|allergic|from|based|vegetarian|vegan|pregnant)\b"
    r"|\bi (?:\w+ )?(?:like|love|hate|prefer|enjoy|dislike|avoid|live|work)\b|\ballerg|\bprefer|\brather\b|\bbudget"
    r"|\bmy (?:wife|husband|partner|son|daughter|kids?|child|children|family|phone|email|address|birthday)\b"
    r"|\b(?:don't|do not|can't|cannot) (?:eat|drink|take|stand)\b|\bnot too\b|\bno more than\b",
    re.IGNORECASE,
)
QUESTION_MARK = re.compile(
    r"[？?]\s*$|[吗呢么嘛][。！!～~]?$|什么|怎么|怎样|多少|哪|几[个次天点号岁种盒瓶月年]|是否|为什么|为啥"
    r"|能不能|可不可以|会不会|是不是|有没有|要不要|可以吗"
    r"|^(?:what|how|which|when|where|why|who|whose|can|could|does|do|did|is|are|was|were|will|would"
    r"|should|shall|may|have|has)\b",
    re.IGNORECASE,
)
# English function words and discourse fillers: capitalised at a sentence start, never names.
# Kept as text: as a list literal, ruff format would spread it over 150 lines.
_EN_STOP = frozenset(
    """a about after again all also am an and any are as at be because been before being but by can
    could did do does don done for from get got had has have he her here hi hello him his how i if in
    into is it its just let like maybe me might more most my no not now of off oh ok okay on once only
    or our out please pm really right so some sorry sure than thank thanks that the their them then
    there these they this those to too up us very was we well were what when where which while who
    why will with would yes yeah you your good great fine nice sounds still even much many want need
    think know see tell make take give go going come say said one two first next last bye goodbye
    welcome hey dr mr mrs ms should must shall enjoy keep help try use look feel thing things time way
    lot lots day today tonight""".split()  # noqa: SIM905
)

# Chinese words that carry no topic: pronouns, "just now", "that one", question words. A question
# that refers back ("刚才那个产品多少钱") matches on what is left.
_ZH_STOP = frozenset(
    """我们 你们 他们 她们 它们 自己 这个 那个 这些 那些 这样 那样 这里 那里 刚才 刚刚 之前 以前 前面 上次
    什么 怎么 怎么样 多少 哪个 哪些 为什么 是不是 有没有 可以 一下 一个 还是 就是 但是 因为 所以 如果 然后
    来着 你好 谢谢 好的 知道 觉得 没有 不是 已经 还有 说的 提到""".split()  # noqa: SIM905
)


@dataclass(frozen=True, slots=True)
class Extraction:
    """One summary: `text` (len <= max_chars) for prompts, `structured` for the next incremental
    merge (JSON-serialisable), and `topics` (<= 10 entity or keyword tags, most salient first)."""

    text: str
    structured: dict[str, Any]
    topics: tuple[str, ...]


class _Jieba:
    """A loaded private jieba dictionary: segmentation, word tags and word frequencies."""

    def __init__(self) -> None:
        # jieba's import alone takes ~0.3 s, so it waits for first use too.
        import jieba
        import jieba.posseg

        logging.getLogger("jieba").setLevel(logging.WARNING)
        self._tokenizer = jieba.Tokenizer()
        self._tokenizer.initialize()
        self._pos = jieba.posseg.POSTokenizer(self._tokenizer)
        self._tags: dict[str, str] = self._pos.word_tag_tab
        self.freq: dict[str, int] = self._tokenizer.FREQ
        self._log_total = math.log(self._tokenizer.total)

    def tag(self, text: str) -> list[tuple[str, str]]:
        """Plain segmentation with dictionary tags is ~5x faster than jieba's POS HMM on the whole
        text; only the out-of-vocabulary pieces, where new names hide, go through the POS HMM."""
        out: list[tuple[str, str]] = []
        for word in self._tokenizer.cut(text):
            if word.isascii():
                tag = "x" if not any(c.isalnum() for c in word) else "eng" if LATIN.search(word) else "m"
            elif (tag := self._tags.get(word, "")) == "" and len(word) > 1:
                for pair in self._pos.cut(word):
                    # The HMM calls many unknown two-character pieces names (太辣, 祝您): demote them.
                    short = len(pair.word) < 3 and pair.word not in self.freq
                    out.append((pair.word, "n" if short and pair.flag in _PROPER_TAGS else pair.flag))
                continue
            out.append((word, tag))
        return out

    def search_words(self, text: str) -> list[str]:
        return list(self._tokenizer.cut_for_search(text))

    def info(self, word: str) -> float:
        """Self-information of a word in jieba's corpus: rare words are the salient ones."""
        freq = self.freq.get(word, 0)
        return self._log_total - math.log(freq) if freq > 0 else self._log_total


class Extractor:
    """Owns a private jieba.Tokenizer created lazily on first use (jieba's dictionary load takes ~1 s,
    so never at import time or construction). Safe to call from worker threads: the lazy init is
    guarded by a lock, and everything after it only reads the dictionary."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jieba: _Jieba | None = None
        # A Snowball stemmer keeps the word it works on in itself: one per thread.
        self._stemmers = threading.local()

    def warm_up(self) -> None:
        """Load the dictionary now (blocking, about a second) rather than on first use."""
        self._loaded()

    def _loaded(self) -> _Jieba:
        if self._jieba is None:
            with self._lock:
                if self._jieba is None:
                    self._jieba = _Jieba()
        return self._jieba

    def extract(
        self,
        messages: Sequence[Message],
        *,
        previous_structured: Mapping[str, Any] | None = None,
        previous_text: str | None = None,
        max_chars: int = 1400,
    ) -> Extraction:
        """Summarise `messages` (in order), merged into `previous_structured` when given, so the cost
        grows with the new messages only. `previous_text` (an LLM summary) becomes the leading
        "earlier summary" item, replacing any earlier one; it is kept to at most half the budget.
        `max_chars` bounds `len(text)` (ValueError if negative); the first call loads jieba's
        dictionary (~1 s)."""
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        jb = self._loaded()
        state = State.load(previous_structured) if previous_structured else None
        if state is None:
            state = State()
        if previous_text and previous_text.strip():
            # An LLM wrote the previous summary: its text leads (replacing any earlier one), so a
            # fallback after it keeps what the LLM had condensed instead of dropping it.
            state.replace_earlier(lead(_SPACES.sub(" ", previous_text).strip(), max_chars))
            state.count_script(previous_text)
        for message in messages:
            _read(jb, state, message)
        topics = state.topics(10)
        cjk, latin = state.script
        # A Chinese character carries about as much as an English word of three or more letters.
        lang = "zh" if cjk > 0 and cjk * 3 >= latin else "en"
        text = render_items(state.items, lang, topics, max_chars)
        state.prune(_KEEP_FACTOR * max_chars)
        return Extraction(text=text, structured=state.dump(), topics=topics)

    def search_terms(self, text: str) -> list[str]:
        """Search terms of `text` for recall: jieba's search-mode words for Chinese (a long word
        and its parts), English words as their Snowball stems (a question's "married" finds "marry",
        "waiting" finds "wait") and numbers; function words and punctuation left out. Safe from
        worker threads."""
        jb = self._loaded()
        stem = self._stemmer()
        out: list[str] = []
        for word in jb.search_words(text):
            word = word.strip().lower()
            if not word:
                continue
            if word.isascii():
                if _NUMERAL.fullmatch(word):
                    out.append(word)
                elif word.isalnum() and len(word) >= 2 and word not in _EN_STOP:
                    out.append(stem(word) if word.isalpha() else word)
            elif len(word) >= 2 and CJK.match(word) and word not in _ZH_STOP:
                out.append(word)
        return out

    def _stemmer(self) -> Callable[[str], str]:
        found: Callable[[str], str] | None = getattr(self._stemmers, "stem", None)
        if found is None:
            import snowballstemmer  # ~10 ms: on first use, like jieba

            found = self._stemmers.stem = snowballstemmer.stemmer("english").stemWord
        return found

    def search_terms_of(self, texts: Sequence[str]) -> list[list[str]]:
        """`search_terms` of each of `texts`, in one call (one trip to a text worker)."""
        return [self.search_terms(text) for text in texts]

    def topics_of(self, text: str, limit: int = 10) -> tuple[str, ...]:
        """Entity and keyword tags of any text (e.g. an LLM summary), most salient first."""
        jb = self._loaded()
        state = State()
        for unit in _units(text):
            for term, score, _ in _terms(jb, unit):
                state.mention(term, score)
        return state.topics(limit)


def _read(jb: _Jieba, state: State, message: Message) -> None:
    if message.role is not Role.TOOL:
        # The conversation's language is what its people speak, not a tool's (often English) keys.
        state.count_script(message.content)
    if message.role is Role.SYSTEM:
        # A gateway's event is what happened (call transferred, on hold): kept as an event, whatever it says.
        state.add(EVENT, "", 1, _clip(_SPACES.sub(" ", message.content).strip(), _ITEM_CHARS), message.turn)
        return
    user = message.role is Role.USER
    for unit in _units(message.content):
        terms = _terms(jb, unit)
        for term, score, _ in terms:
            state.mention(term, score)
        if all(is_phatic(clause) for clause in clauses(unit)):
            continue  # greetings, thanks, "Hey Anna!", "嗯嗯", a bare date stamp
        named = any(is_named for _, _, is_named in terms)
        number = _NUMBER.search(strip_stamp(unit)) is not None
        if len(NOT_WORD.sub("", unit)) < 3 and not number:
            continue  # "好的", "ok", "嗯嗯"
        if user and not state.subject and (named or number):
            state.subject = _clip(condense(unit) or unit, _SUBJECT_CHARS)
        _keep(state, message, unit, terms, named=named, number=number)


def _keep(
    state: State, message: Message, unit: str, terms: Sequence[tuple[str, float, bool]], *, named: bool, number: bool
) -> None:
    """Add `unit`, one sentence of `message` that `_read` found informative (not phatic, not too
    short), under its kind and rank; nothing when it is none of what is kept."""
    user = message.role is Role.USER
    # A tool's result is what the system looked up (an order's number, a price, a date): its
    # names and numbers are facts as the user's are, already terse (dialogue.readable).
    tool = message.role is Role.TOOL
    turn = message.turn
    # Ranks are coarse on purpose: within one, the earliest fact wins, so a long session of
    # numeric small talk cannot push out the dose the user asked about at the start.
    if user and PROFILE_MARK.search(unit):
        state.add(PROFILE, "user", 0, _clip(unit, _ITEM_CHARS), turn)
    elif user and QUESTION_MARK.search(unit):
        state.add(QUESTION, "user", 1 if named or number else 2, _clip(unit, _ITEM_CHARS), turn)
    elif tool and (named or number):
        state.add(FACT, "tool", 1, _clip(unit, _ITEM_CHARS), turn)
    elif user and (named or number):
        state.add(FACT, "user", 1, _clip(_terse(_dense(unit, terms)), _ITEM_CHARS), turn)
    elif named or number:
        # The assistant names things in passing and in pleasantries; its numbers are what
        # later turns quote back ("the 398 one", "you said twice a day").
        text = _clip(_terse(_dense(unit, terms)), _ITEM_CHARS - len("assistant: "))
        state.add(FACT, "assistant", 1 if number else 2, text, turn)


def _dense(unit: str, terms: Sequence[tuple[str, float, bool]]) -> str:
    """The clauses of a fact that carry a number or a name ("嗯，口碑也还不错，才2900万美元的小成本
    制作" keeps "才2900万美元的小成本制作"): a budget then holds more facts, not more filler."""
    parts = [c.strip() for c in _CLAUSE_END.split(unit) if NOT_WORD.sub("", c)]
    if len(parts) < 2:
        return unit
    names = [term for term, _, is_named in terms if is_named]
    kept = [c for c in parts if not is_phatic(c) and (_NUMBER.search(c) or any(n in c for n in names))]
    return "".join(kept).rstrip("，,、：:") if kept else unit


def _terse(text: str) -> str:
    """An English fact without its function words ("I bought a Honda for $900" → "bought Honda
    $900"): the same names and numbers in fewer characters. Chinese is kept as it is."""
    if CJK.search(text):
        return text
    return condense(text) or text


def _terms(jb: _Jieba, text: str) -> list[tuple[str, float, bool]]:
    """(term, salience, is a named entity) for each entity or keyword occurrence in `text`.
    Capitalised English words in a row ("John Smith", "iPhone 15 Pro") make one name; a
    capitalised first word alone is taken for a name only when oddly cased ("iPhone", "X5")."""
    tokens = jb.tag(text)
    out: list[tuple[str, float, bool]] = []
    run: list[str] = []
    first = True
    for i, (word, tag) in enumerate(tokens):
        if tag == "eng" and _is_english_name(word, first=first and not _name_follows(tokens, i + 1)):
            run.append(word)
            first = False
            continue
        first = first and not any(c.isalnum() for c in word)
        if run and (word == " " or (tag == "m" and _name_follows(tokens, i + 1))):
            if word != " ":
                run.append(word)  # "iPhone 15 Pro", but not "Advil 200 mg"
            continue
        if run:
            out.append((" ".join(run), 3 * jb.info(""), True))
            run = []
        if tag == "eng" and len(word) >= 4 and word.isalpha() and word.lower() not in _EN_STOP:
            out.append((word.lower(), 0.3 * jb.info(""), False))
        elif len(word) >= 2 and CJK.match(word) and tag in _PROPER_TAGS:
            named = not (tag.startswith("nr") and jb.freq.get(word, 0) >= _COMMON_NAME_FREQ)
            out.append((word, (3 if named else 1) * jb.info(word), named))
        elif len(word) >= 2 and CJK.match(word) and tag in _NOUN_TAGS:
            out.append((word, jb.info(word), False))
    if run:
        out.append((" ".join(run), 3 * jb.info(""), True))
    return out


def _name_follows(tokens: Sequence[tuple[str, str]], i: int) -> bool:
    """Whether tokens[i:] is a space and then an English name."""
    if i + 1 >= len(tokens) or tokens[i][0] != " ":
        return False
    word, tag = tokens[i + 1]
    return tag == "eng" and _is_english_name(word)


def _is_english_name(word: str, *, first: bool = False) -> bool:
    """Capitalised (not merely as a sentence's `first` word) or oddly cased (iPhone, X5), but not
    a quantity (16GB)."""
    if len(word) < 2 or word.lower() in _EN_STOP:
        return False
    odd = word[0].isalpha() and any(c.isupper() or c.isdigit() for c in word[1:])
    return odd or (word[0].isupper() and not first)


def _units(text: str) -> list[str]:
    """Sentences of `text`; a long sentence without full stops (voice transcripts) is re-cut at
    commas into clauses of about _CHUNK_CHARS, so each unit is one fact rather than a paragraph."""
    out: list[str] = []
    for piece in _SENTENCE_END.split(text):
        piece = _SPACES.sub(" ", piece).strip()
        if len(piece) <= _ITEM_CHARS:
            out.append(piece)
            continue
        chunk = ""
        for clause in _CLAUSE_END.split(piece):
            if chunk and len(chunk) + len(clause) > _CHUNK_CHARS:
                out.append(chunk)
                chunk = ""
            chunk += clause
        out.append(chunk)
    return [unit.strip(" ，,、：:") for unit in out if NOT_WORD.sub("", unit)]


def _clip(text: str, limit: int) -> str:
    """At most `limit` chars; the window is moved to the first number when that lies past the middle."""
    if len(text) <= limit:
        return text
    found = _NUMBER.search(text)
    if found is None or found.start() < limit // 2:
        return text[: limit - 1] + "…"
    start = found.start() - limit // 3
    if start + limit - 1 >= len(text):
        return "…" + text[len(text) - limit + 1 :]
    return "…" + text[start : start + limit - 2] + "…"

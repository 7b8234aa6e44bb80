"""Condensing conversation text: the same facts in fewer characters, with no dictionary and no I/O.

A context that must reach further back than its budget holds raw spends its characters on what
later turns ask for (names, numbers, dates, products, preferences) rather than on the words
around them. Three pure tools, shared by the context policy and the deterministic extractor:
`clauses` cuts text where a fact can end, `is_phatic` recognises a clause that carries nothing
(greetings, thanks, forms of address, "yeah", "嗯嗯", a bare date stamp), and `condense` drops
those clauses and English function words while keeping every content word, number and name
verbatim, so that whatever a probe could quote survives. Chinese keeps its words (it has few
function words that are safe to drop); only its fillers and sentence-final particles go.
"""

from __future__ import annotations

import re

# Clause ends: sentence punctuation of both scripts, commas, semicolons, dashes and line breaks.
_CLAUSE_END = re.compile(r"(?<=[。！？!?；;，\n])|(?<=,)(?!\d)|(?<=[.…])\s+|\s+[-–—]+\s+")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’]*|\d[\d.,:/%-]*|[^\sA-Za-z\d]")
_CJK = re.compile(r"[\u3400-\u9fff]")
_CONTENT = re.compile(r"[\w\u3400-\u9fff]")
# A date or time stamp: "[Tue 2024-03-05]", "2024-03-05 19:20", "05/03/2024", "Mar 5, 2024".
_STAMP = re.compile(
    r"^[\[(]?\s*(?:(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*\.?,?\s*)?"
    r"(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}"
    r"|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+\d{1,2}(?:st|nd|rd|th)?,?\s*(?:\d{4})?"
    r"|\d{1,2}(?:st|nd|rd|th)?\s+(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?,?\s*(?:\d{4})?)"
    r"(?:[ T,]+\d{1,2}:\d{2}(?::\d{2})?\s*(?:am|pm)?)?\s*[\])]?\s*[:：-]?\s*",
    re.IGNORECASE,
)

# English words that carry no fact by themselves. Negations, quantities and verbs of preference
# ("like", "prefer", "hate") are not here: dropping them would change what a clause says.
_FUNCTION = frozenset(
    """a an the this that these those it its it's itself i i'm i've i'd i'll me my mine myself you
    you're you've you'd you'll your yours yourself he he's him his himself she she's her hers
    herself we we're we've our ours they they're they've them their theirs there there's here
    is am are was were be been being do does did doing have has had having will would shall
    should can could may might must of to in on at by for with about as from into onto than then
    so and or but if because while also just really very quite actually basically pretty too
    well oh ah um uh hmm yeah yep yes ok okay lol haha hahaha wow sure right cool great nice
    what's that's which who whom whose what""".split()  # noqa: SIM905
)
# Clauses made only of these (and names, as in "Hey Anna!") are phatic: greetings, thanks,
# agreement, laughter.
_PHATIC = _FUNCTION | frozenset(
    """hi hello hey hiya thanks thank thx welcome bye goodbye cheers please sorry good morning
    afternoon evening night agreed agree absolutely definitely totally indeed exactly true
    interesting fun funny awesome amazing lovely sounds sound know see guess think mean
    nice glad hear too much same true lmao lmfao omg gosh dear buddy friend man dude guys noted
    alright gotcha""".split()  # noqa: SIM905
)
# Words that open a form of address: "Hey Anna", "Thanks Tom", "Yeah Mike", "Sorry Jo".
_GREETING = frozenset(
    """hi hello hey hiya thanks thank thx bye goodbye cheers dear yeah yes yep ok okay sure well oh
    ah wow haha lol right cool great nice sorry no nope absolutely exactly true indeed awesome""".split()  # noqa: SIM905
)
# Chinese fillers and sentence-final particles: a clause of only these says nothing.
_ZH_FILLER = re.compile(
    r"^(?:真是|真的|真|太|非常|很|你|您|了|啊|呀|啦|哦|呢|吧|嘛|嗯+|啊+|哦+|噢+|哈+|呵+|嘿+|呀+|诶+|唉+|好的?|好吧|行|可以|是的?|对的?|对呀|没错|谢谢(?:你|您)?|多谢|不客气"
    r"|没关系|明白了?|知道了|了解|收到|再见|拜拜|你好|您好|嗯嗯|哈哈+|确实|真的|是吗|这样啊|原来如此|太好了)+$"
)
_ZH_EDGE = re.compile(r"^(?:嗯+|啊+|哦+|哈+|诶+|好的|是的|对)[，,、。！!～~\s]*|[啊呀呢吧啦嘛哦哈～~]+(?=[。！？!?]*$)")


def clauses(text: str) -> list[str]:
    """The clauses of `text`, stripped, in order; pieces without a letter, digit or CJK character
    are left out."""
    out = []
    for piece in _CLAUSE_END.split(text):
        piece = " ".join(piece.split()).strip(" ,，、")
        if piece and _CONTENT.search(piece):
            out.append(piece)
    return out


def strip_stamp(clause: str) -> str:
    """The clause without a leading date or time stamp ("[Tue 2024-03-05] Hi" → "Hi")."""
    found = _STAMP.match(clause)
    return clause[found.end() :] if found and found.end() > 0 and re.search(r"\d", found.group()) else clause


def is_phatic(clause: str) -> bool:
    """Whether a clause carries nothing a later turn could ask about: a greeting, thanks,
    agreement, laughter, a form of address, filler, or a bare date stamp. A clause with a number
    (after its stamp), or with any content word, is not phatic."""
    rest = strip_stamp(clause).strip(" .!?,;:…，。！？；：")
    if not rest:
        return True
    if _CJK.search(rest):
        return _ZH_FILLER.match(re.sub(r"[\s，,、。！!？?～~…]+", "", rest)) is not None
    words = _WORD.findall(rest)
    letters = [w for w in words if w[0].isalpha()]
    if any(w[0].isdigit() for w in words):
        return False
    greeting = bool(letters) and letters[0].lower() in _GREETING
    for w in letters:
        low = w.lower().replace("’", "'")
        if low in _PHATIC:
            continue
        # A capitalised word after a greeting is the person addressed ("Hey Anna", "Thanks Tom").
        if greeting and w[0].isupper():
            continue
        return False
    return True


def condense(text: str) -> str:
    """The text with phatic clauses dropped and, in English, lower-case function words dropped
    (a capitalised one inside a name, "Lord of the Rings", stays with its name); numbers, names,
    negations and every other word are kept verbatim. Chinese loses only its fillers and the
    particles at a clause's edges. Empty when nothing is left."""
    return " ".join(condensed_clauses(text))


def condensed_clauses(text: str) -> list[str]:
    """`condense`, clause by clause: the condensed form of each clause that is not phatic."""
    kept: list[str] = []
    stamp = ""
    for clause in clauses(text):
        if is_phatic(clause):
            # A stamp dates what follows it ("[Tue 2024-03-05] Hi! I bought …"): it moves on.
            rest = strip_stamp(clause)
            stamp = stamp or clause[: len(clause) - len(rest)].strip()
            continue
        if stamp:
            clause = f"{stamp} {clause}" if strip_stamp(clause) == clause else clause
            stamp = ""
        short = (_ZH_EDGE.sub("", clause) or clause) if _CJK.search(clause) else _drop_function_words(clause)
        if short:
            kept.append(short)
    return kept


def _drop_function_words(clause: str) -> str:
    tokens = clause.split()
    small = [_word(t) in _FUNCTION for t in tokens]
    out: list[str] = []
    for i, token in enumerate(tokens):
        if small[i] and not (_inside_name(tokens, small, i) or _leads_name(tokens, small, i)):
            continue
        out.append(token)
    return " ".join(out).strip(" ,;:")


def _leads_name(tokens: list[str], small: list[bool], i: int) -> bool:
    """Whether tokens[i] opens a name or a date: "The" before "Linden Hotel", "the" before
    "Lord of the Rings" or "15th" (a name or a date is quoted back with its article)."""
    if i + 1 >= len(tokens) or small[i + 1]:
        return False
    after = tokens[i + 1].lstrip("\"'([")
    if _word(tokens[i]) == "the" and (after[:1].isdigit() or _capital(after)):
        return True
    return _capital(tokens[i]) and _capital(after)


def _word(token: str) -> str:
    return token.strip(".,;:!?\"'()[]…").lower().replace("’", "'")


def _inside_name(tokens: list[str], small: list[bool], i: int) -> bool:
    """Whether the run of function words around tokens[i] sits between two capitalised words
    ("Lord of the Rings", "Bank of America"): then it is part of a name."""
    before, after = i - 1, i + 1
    while before >= 0 and small[before]:
        before -= 1
    while after < len(tokens) and small[after]:
        after += 1
    return before >= 0 and after < len(tokens) and _capital(tokens[before]) and _capital(tokens[after])


def _capital(token: str) -> bool:
    token = token.strip("\"'([")
    return bool(token) and token[0].isupper()


_NUMBER_KEY = re.compile(r"\d+(?:[.,:/]\d+)*[%\u3400-\u9fff]?")
_LATIN_CONTENT = re.compile(r"[A-Za-z][A-Za-z'’-]{3,}")
_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_NAME_KEY = re.compile(r"(?<![.!?。！？]\s)(?<!^)\b[A-Z][\w'’-]+|\b[a-z]+[A-Z\d][\w-]*")


def keys(text: str) -> set[str]:
    """What in `text` a later question may ask for most: its numbers (with a Chinese unit or a
    percent sign right after, "2次", "450元") and its capitalised or oddly cased words past a
    sentence's start (names, products). Case-folded."""
    found = set(_NUMBER_KEY.findall(text))
    found |= {w.casefold() for w in _NAME_KEY.findall(text) if w.casefold() not in _PHATIC}
    return found


def words(text: str) -> set[str]:
    """The content words of `text`, case-folded: English words of four or more letters that are
    not function words, and every pair of adjacent Chinese characters (Chinese has no spaces;
    a pair is the unit most of its words are made of)."""
    found = {w.casefold() for w in _LATIN_CONTENT.findall(text) if w.casefold() not in _PHATIC}
    for run in _CJK_RUN.findall(text):
        found.update(run[i : i + 2] for i in range(len(run) - 1))
    return found

"""Numbers as values, however a text writes them: 5,000 and 5 000 and 5000, full-width ５０００,
five thousand, 5 thousand, 5k, 五千 and 5千, three o'clock and 3 点 and 三点, 12:30 and 十二点半.

`to_digits` rewrites the numerals of a text as digits; `numbers` reads the digits as canonical
values ("03" is "3", "3.50" is "3.5"). A date or a time is read part by part (2026-12-01 is 2026,
12 and 1), so 2026-12-01, 2026年12月1日 and December 1, 2026 hold the same values: the parts
can be rearranged unnoticed, which costs little, while a format the LLM chose is never taken for
an invention. Grounding (grounding.py) compares these values.

Two readings. A source is read liberally: every numeral that may be a number is one, since what
the source says may match anything it could mean. An item the LLM wrote is read strictly: the
words that are more often not numbers at all are left as words, so an item is not dropped for a
word that only looks like a number: English "one" alone ("the blue one", "one of"), Chinese 一
alone (一下, 一起, 一个问题: the article more than the count), 十分 ("very"), and a Chinese numeral
that has neither a place in it (二十, 五千) nor a measure word after it (三点, 两盒) nor 第 before it
(千万别, 万一, 一一).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

Number = frozenset[tuple[str, ...]]
"""One number as its readings: it is in a source when every value of one reading is. Mostly a
single reading of one value; "3pm" is ("3",) or ("15",), "5 000" is ("5000",) or ("5", "0")."""

_MONTHS = {
    name: i
    for i, names in enumerate(
        [
            ("January", "Jan"),
            ("February", "Feb"),
            ("March", "Mar"),
            ("April", "Apr"),
            ("May",),
            ("June", "Jun"),
            ("July", "Jul"),
            ("August", "Aug"),
            ("September", "Sep", "Sept"),
            ("October", "Oct"),
            ("November", "Nov"),
            ("December", "Dec"),
        ],
        start=1,
    )
    for name in names
}
# Month names are capitalized in English: "may" and "march" are verbs. An abbreviation counts
# only before a day ("Dec 5"), since "Jun" or "Jan" alone may be a name.
_MONTH = re.compile(
    r"\b(January|February|March|April|May|June|July|August|September|October|November|December)\b"
    r"|\b(Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\b\.?(?=[ \t]*\d)"
)

_EN_UNITS = {
    w: i
    for i, w in enumerate(
        re.findall(
            r"\w+",
            "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
            " sixteen seventeen eighteen nineteen",
        )
    )
}
_EN_TENS = {
    w: 10 * i
    for i, w in enumerate(re.findall(r"\w+", "twenty thirty forty fifty sixty seventy eighty ninety"), start=2)
}
_EN_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_EN_WORD = "|".join(sorted([*_EN_UNITS, *_EN_TENS, *_EN_SCALES], key=len, reverse=True))
# A run of number words: "two hundred and fifty", "twenty-five", "a thousand".
_EN_RUN = re.compile(
    rf"\b(?:a[ \t]+(?=(?:hundred|thousand|million|billion)\b))?(?:{_EN_WORD})"
    rf"(?:(?:[ \t]+and[ \t]+|[ \t-]+)(?:{_EN_WORD}))*\b",
    re.IGNORECASE,
)
# The longest numeral read, in words or Chinese characters: longer runs are no number anyone writes,
# and would be values past what an int prints.
_MAX_RUN = 24
_EN_TIMES = re.compile(r"\b(?:(twice)|(thrice)|(once))\b", re.IGNORECASE)

_ZH_DIGITS = {c: int(d) for c, d in zip("零〇一二两三四五六七八九", "001223456789", strict=True)}
_ZH_PLACES = {"十": 10, "百": 100, "千": 1000}
_ZH_SECTIONS = {"万": 10**4, "亿": 10**8}
_ZH_RUN = re.compile(r"[零〇一二两三四五六七八九十百千万亿]+")
# What follows a count in Chinese (三点, 两盒, 五千元, 三小时, 五公斤): the numeral before it is a number.
_ZH_MEASURES = frozenset(
    "个点元块角毛分秒次条盒瓶包袋箱件台张本只位名人天日号月年岁周楼层室斤克米里倍折成份套杯碗晚夜间辆双对颗粒片期栋级星度小公%"
)
_ZH_PERCENT = re.compile(r"百分之([零〇一二两三四五六七八九十百千]+)")
_ZH_HALF_PAST = re.compile(r"(?<=[\d零〇一二两三四五六七八九十])点半")
# Units spelled with 千 (三千克 is three kilograms, not 3,000 grams) are rewritten 公克, 公米…: 公 is a
# measure word like 公斤's, so the numeral before it stays a count.
_ZH_KILO_UNITS = re.compile(r"千(?=[克米瓦卡])")

# A value written with its scale: 5万, 3.5 million, 5k (百分, percent, is no hundred). Every pattern
# here starts where its run of digits or letters starts (the lookbehinds): one that could start
# inside a long run would try every start in it, quadratic in a 30 KB tool result.
_SCALED = re.compile(
    r"(?<![\d.])(\d+(?:\.\d+)?)[ \t]*(?:(hundred|thousand|million|billion)\b|(万|亿|千|百(?!分))|(k)\b)",
    re.IGNORECASE,
)
_SCALE_OF = {**_EN_SCALES, "万": 10**4, "亿": 10**8, "千": 1000, "百": 100, "k": 1000}

# 5,000 is five thousand (a comma before exactly three digits groups them); "5 000" may be five
# thousand or a five and a zero, so it is read both ways.
_COMMA_GROUPED = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?!\d)")
_NUMBER = re.compile(r"(?P<spaced>(?<![\d.,])\d{1,3}(?: \d{3})+(?![\d.,]))|(?P<plain>\d+(?:\.\d+)*)")
_PM_AFTER = re.compile(r"[ \t]*p\.?[ \t]?m\b", re.IGNORECASE)
_PM_BEFORE = re.compile(r"(?:下午|晚上|傍晚)[ \t]*$")


def canonical(digits: str) -> str:
    """A number's one spelling: no leading zeros, a decimal without trailing zeros ("3.50" is
    "3.5", "5.0" is "5"). `digits` is ASCII digits with at most one dot."""
    whole, _, fraction = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def _scaled(match: re.Match[str]) -> str:
    scale = _SCALE_OF[(match.group(2) or match.group(3) or match.group(4)).lower()]
    try:
        value = Decimal(match.group(1)) * scale
    except InvalidOperation:
        return match.group()
    return f" {canonical(format(value, 'f'))} "


def _en_values(words: list[str]) -> list[int]:
    """The numbers a run of number words says: "two hundred fifty" is [250], "two three" is [2, 3]
    (a unit after a unit starts another number)."""
    values: list[int] = []
    total = current = 0
    last = ""
    for word in words:
        if word in _EN_SCALES:
            if word == "hundred":
                current = (current or 1) * 100
            else:
                total += (current or 1) * _EN_SCALES[word]
                current = 0
            last = "scale"
            continue
        value = _EN_UNITS.get(word, _EN_TENS.get(word, 0))
        kind = "tens" if word in _EN_TENS else "unit"
        # "twenty five" is one number; "five twenty", "twenty thirty" and "two three" are two.
        if last == "unit" or (last == "tens" and (kind == "tens" or value >= 10)):
            values.append(total + current)
            total = current = 0
        current += value
        last = kind
    values.append(total + current)
    return values


def _en_run(strict: bool) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        words = [w.lower() for w in re.split(r"[ \t-]+", match.group()) if w.lower() != "and"]
        # A run that long is no number anyone says, and its value would not print.
        if len(words) > _MAX_RUN:
            return match.group()
        if words[0] == "a":
            words[0] = "one"
        if strict and words == ["one"]:
            return match.group()
        return " " + " ".join(str(v) for v in _en_values(words)) + " "

    return replace


def _zh_value(run: str) -> int | None:
    """The value of a Chinese numeral: 十二 12, 三百零五 305, 两千 2000, 一万二千 12000, 三百五 350 (the
    spoken short form), 二〇二六 2026 (digit by digit). None for what is not a well-formed numeral
    (万一, 百千)."""
    if len(run) > _MAX_RUN:
        return None
    if not any(c in _ZH_PLACES or c in _ZH_SECTIONS for c in run):
        return int("".join(str(_ZH_DIGITS[c]) for c in run))
    if run[0] in _ZH_SECTIONS:
        return None
    total = section = digit = 0
    have_digit = after_zero = False
    place = 10**12
    for c in run:
        if c in _ZH_DIGITS:
            if have_digit and not after_zero:
                return None
            after_zero = _ZH_DIGITS[c] == 0
            digit, have_digit = _ZH_DIGITS[c], True
        elif c in _ZH_PLACES:
            if _ZH_PLACES[c] >= place:
                return None
            section += (digit if have_digit else 1) * _ZH_PLACES[c]
            place, digit, have_digit, after_zero = _ZH_PLACES[c], 0, False, False
        elif c == "万":
            section = (section + digit) * 10**4
            place, digit, have_digit, after_zero = 10**4, 0, False, False
        else:
            total = (total + section + digit) * 10**8
            section, place, digit, have_digit, after_zero = 0, 10**8, 0, False, False
    # 三百五 is 350 and 一万二 12000: a last digit straight after a place counts in the place below it.
    if have_digit and not after_zero and place > 10 and run[-2] in "百千万亿" and run[0] in _ZH_DIGITS:
        digit *= place // 10
    return total + section + digit


def _zh_run(strict: bool) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        run, text = match.group(), match.string
        before = text[match.start() - 1] if match.start() else ""
        after = text[match.end()] if match.end() < len(text) else ""
        if strict and not _zh_is_number(run, before, after):
            return run
        value = _zh_value(run)
        return run if value is None else f" {value} "

    return replace


def _zh_is_number(run: str, before: str, after: str) -> bool:
    """Whether a Chinese numeral in an item is read as a number (the strict reading)."""
    if run == "一" or (run == "十" and after == "分"):
        return False
    if before == "第" or after in _ZH_MEASURES:
        return True
    has_place = any(c in _ZH_PLACES or c in _ZH_SECTIONS for c in run)
    if len(run) >= 2 and has_place and (run[0] in _ZH_DIGITS or run[0] == "十"):
        return True
    return len(run) >= 3 and not has_place


def to_digits(text: str, *, strict: bool) -> str:
    """`text` with its numerals written in digits (month names, English number words and Chinese
    numerals; a value with its scale multiplied out), in the liberal or the `strict` reading.
    Replacements are padded with spaces, so that two numbers never run together."""

    def month(m: re.Match[str]) -> str:
        return f" {_MONTHS[m.group(1) or m.group(2)]} "

    def times(m: re.Match[str]) -> str:
        if m.group(3):
            return m.group() if strict else " 1 "
        return " 2 " if m.group(1) else " 3 "

    def percent(m: re.Match[str]) -> str:
        value = _zh_value(m.group(1))
        return m.group() if value is None else f" {value}%"

    text = _MONTH.sub(month, text)
    text = _ZH_PERCENT.sub(percent, text)
    text = _ZH_HALF_PAST.sub("点30分", text)
    text = _ZH_KILO_UNITS.sub("公", text)
    text = _SCALED.sub(_scaled, text)
    text = _ZH_RUN.sub(_zh_run(strict), text)
    text = _EN_TIMES.sub(times, text)
    return _EN_RUN.sub(_en_run(strict), text)


def numbers(text: str) -> list[Number]:
    """The numbers written in digits in `text`, each as its readings (see Number). A dotted run
    with two dots or more (2026.12.01, an IP address) is read part by part, like 12:30 and
    2026-12-01; one dot is a decimal."""
    text = _COMMA_GROUPED.sub(lambda m: m.group().replace(",", ""), text)
    out: list[Number] = []
    for m in _NUMBER.finditer(text):
        if m.group("spaced"):
            parts = m.group().split(" ")
            out.append(frozenset({(canonical("".join(parts)),), tuple(canonical(p) for p in parts)}))
            continue
        parts = m.group().split(".")
        if len(parts) > 2:
            out.extend(frozenset({(canonical(p),)}) for p in parts)
            continue
        value = canonical(m.group())
        readings = {(value,)}
        # 3pm and 下午3点 are 15:00 too.
        afternoon = _PM_AFTER.match(text, m.end()) or _PM_BEFORE.search(text, max(0, m.start() - 8), m.start())
        if afternoon and len(value) <= 2 and "." not in value and 1 <= int(value) <= 11:
            readings.add((str(int(value) + 12),))
        out.append(frozenset(readings))
    return out

"""What a PromQL expression reads: its metric selectors (name and matcher labels) and the labels it
groups by. Enough of the grammar for the expressions of deploy/ (dashboards and alert rules), so a
test can hold each name against what the daemon exports; not a full PromQL parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# String literals first: a route label's value holds braces ("/v1/sessions/{session_id}/context").
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_SELECTOR = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)\s*(\{[^{}]*\})?")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*$")
# Words of the language that look like a metric name where they stand.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan", "by", "without"}
)


@dataclass(frozen=True)
class Selector:
    """One metric read by an expression: its name and the label names its matchers use."""

    metric: str
    labels: frozenset[str]


def _prepared(expr: str) -> str:
    blanked = _STRING.sub('""', expr)
    # Grafana's variables ($__rate_interval, $job) stand in ranges or inside strings.
    return _RANGE.sub("", blanked)


def selectors(expr: str) -> list[Selector]:
    """Every metric selector of `expr`, in order. Grafana's `label_values(selector, label)`
    template query is read as its selector."""
    template = _LABEL_VALUES.match(expr)
    if template is not None:
        expr = template.group(1)
    text = _GROUPING.sub(" ", _prepared(expr))
    found = []
    for m in _SELECTOR.finditer(text):
        name, matchers = m.group(1), m.group(2)
        if name in _KEYWORDS:
            continue
        if matchers is None and text[m.end() :].lstrip().startswith("("):
            continue  # a function or aggregation, not a metric
        found.append(Selector(name, frozenset(_MATCHER_LABEL.findall(matchers or ""))))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Label names of every by/without/on/ignoring/group_left/group_right clause."""
    labels: set[str] = set()
    for group in _GROUPING.findall(_prepared(expr)):
        labels |= {part.strip() for part in group.split(",") if part.strip()}
    return labels

"""The judge's side of grading, as pure functions: the statements an item leaves to a judge (its
expectations and `llm-rubric` assertions), the judge's messages, reading its reply, and the majority
of several samples.

A judge answers one verdict per statement: passed or not, and the part of the output it quotes as
evidence. With k samples a statement passes when more than half of them say so (a tie fails: an
undecided judge never passes an output), and the evidence kept is the first sample's that agrees with
the majority. A reply that cannot be read is an error of that call, never a verdict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skillstate.errors import clip
from skillstate.prompts import render

EVIDENCE_CHARS = 300  # a verdict's quoted evidence is cut to about this many characters
_FENCED = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)


class Statement(BaseModel):
    """One thing a judge grades: an expectation, or an `llm-rubric` assertion (`index` its position in the
    item's assertions)."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "expectation" | "llm-rubric"
    text: str
    index: int  # among the item's expectations, or its assertions
    negate: bool = False  # not-llm-rubric: passes when the rubric does not
    weight: float = 1.0


class Verdict(BaseModel):
    """A judge's verdict on one statement."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=1)
    passed: bool
    evidence: str = ""


class JudgeReply(BaseModel):
    """The reply's shape (sent as a JSON schema with `judge.response_format: json_schema`)."""

    verdicts: list[Verdict]


class Decided(BaseModel):
    """A statement's grade after every sample: passed by the majority, the votes in sample order."""

    model_config = ConfigDict(frozen=True)

    statement: Statement
    passed: bool
    evidence: str
    votes: tuple[bool, ...]

    @property
    def unanimous(self) -> bool:
        return len(set(self.votes)) == 1


def statements_of(expectations: Sequence[str], assertions: Sequence[Any]) -> list[Statement]:
    """What a judge grades of an item: its expectations, then its `llm-rubric` assertions (`Assertion`s)."""
    out = [Statement(kind="expectation", text=text, index=n) for n, text in enumerate(expectations)]
    for n, assertion in enumerate(assertions):
        if assertion.type == "llm-rubric":
            out.append(Statement(kind="llm-rubric", text=str(assertion.value), index=n, negate=assertion.negate,
                                 weight=assertion.weight))
    return out


def judge_messages(prompts: dict[str, str], task: str, output: str,
                   statements: Sequence[Statement]) -> list[dict[str, Any]]:
    """The judge's request: the task, the output and the numbered statements (never the skill, and never the
    optimizer's prompts)."""
    listed = "\n".join(f"{n}. {s.text}" for n, s in enumerate(statements, 1))
    user = render(prompts["judge_user"], task=task, output=output, expectations=listed)
    return [{"role": "system", "content": prompts["judge_system"].strip()}, {"role": "user", "content": user}]


def read_verdicts(text: str, count: int) -> list[Verdict] | str:
    """The verdicts of a judge's reply, one per statement in order; a string saying what is wrong when the
    reply is not that (not JSON, the wrong shape, a statement missing or graded twice)."""
    body = text.strip()
    fenced = _FENCED.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        start, end = body.find("{"), body.rfind("}")
        try:
            data = json.loads(body[start:end + 1]) if 0 <= start < end else None
        except (json.JSONDecodeError, RecursionError):
            data = None
        if data is None:
            return "the judge's reply is not JSON"
    try:
        reply = JudgeReply.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        return f"the judge's reply has the wrong shape ({where}: {first['msg']})"
    by_index: dict[int, Verdict] = {}
    for verdict in reply.verdicts:
        if verdict.index in by_index:
            return f"the judge graded statement {verdict.index} twice"
        by_index[verdict.index] = verdict
    missing = [n for n in range(1, count + 1) if n not in by_index]
    if missing:
        return f"the judge's reply has no verdict for statement {missing[0]} (of {count})"
    return [by_index[n].model_copy(update={"evidence": clip(by_index[n].evidence, EVIDENCE_CHARS)})
            for n in range(1, count + 1)]


def majority(statements: Sequence[Statement], samples: Sequence[Sequence[Verdict]]) -> list[Decided]:
    """Each statement's grade over the samples (each a list of verdicts in statement order)."""
    out = []
    for n, statement in enumerate(statements):
        votes = tuple(sample[n].passed for sample in samples)
        passed = sum(votes) * 2 > len(votes)
        evidence = next((sample[n].evidence for sample in samples if sample[n].passed == passed), "")
        # a negated rubric passes when the judge finds the rubric unmet
        out.append(Decided(statement=statement, passed=passed != statement.negate, evidence=evidence, votes=votes))
    return out


def agreement(decided: Sequence[Decided]) -> float | None:
    """The share of statements every sample graded alike; None with no statements or a single sample."""
    several = [d for d in decided if len(d.votes) > 1]
    if not several:
        return None
    return sum(d.unanimous for d in several) / len(several)

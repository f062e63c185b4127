"""The value objects events are made of: usage, call references, edits,
item results and scores. All frozen."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Usage(Frozen):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class CallRef(Frozen):
    """One LLM request the event depended on (full text in the call table)."""

    request_hash: str
    role: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class Edit(Frozen):
    op: str
    target: str = ""
    content: str = ""
    source: str = "failure"  # failure | success
    support: int = 0  # number of trajectories behind it
    # a run that trains a skill directory: the file the edit is for ("" is SKILL.md); left out of dumps when ""
    file: str = ""

    @property
    def keyed_op(self) -> str:
        """The op as the count of rejected edits keys it: with the file, where the edit names one (so an edit
        of a reference is not taken for the same edit of SKILL.md)."""
        return f"{self.op}@{self.file}" if self.file else self.op

    @model_serializer(mode="wrap")
    def _without_file_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if not data.get("file"):
            data.pop("file", None)
        return data


class DroppedEdit(Frozen):
    """A proposed edit left out before selection because it would change nothing, or (drop_rejected_edits)
    because it failed before (see skillstate.skillopt.screen); or after it, because it would leave a link in
    SKILL.md pointing at nothing (`dangling_link`, skillstate.skillopt.linked_pairs)."""

    index: int  # into the merged edits
    reason: str


class PartialEval(Frozen):
    """An evaluation stopped early because a reject was certain: the first
    `scored` of `of` items (in `order`) were scored, and even with every item
    left succeeding the gate score could reach at most `upper_bound`."""

    scored: int
    of: int
    upper_bound: float
    item_ids: list[str]  # the items scored, in the order they were evaluated


class ApplyEntry(Frozen):
    index: int
    op: str
    status: str  # applied | appended | unchanged | skipped_absent | skipped_empty_target | skipped_unknown_op


class RetrievedSkill(Frozen):
    """One bank skill put in the agent's prompt; `similarity` is None in template retrieval."""

    skill_id: str
    similarity: float | None = None


class ItemResult(Frozen):
    item_id: str
    task_type: str = ""
    hard: float
    soft: float
    fail_reason: str = ""
    prediction: str = ""
    trajectory: str | None = None  # blob hash of the conversation (of the whole episode, for a multi-turn env)
    call: CallRef | None = None  # the one call of a single-turn rollout
    calls: list[CallRef] = []  # every call of a multi-turn rollout, in order
    turns: int = 0  # actions taken (multi-turn)
    seed: int | None = None  # what the environment was reset with (multi-turn)
    retrieved: list[RetrievedSkill] = []  # mode bank: the skills the agent was shown (left out of dumps when none)
    sample: int | None = None  # one of `samples` per item (eval runs for GRPO groups; left out of dumps when None)
    # disclosure tools: the installed skills the target loaded, and the files it read ("skill/path"); left out
    # of dumps when empty
    skills_loaded: list[str] = []
    files_read: list[str] = []

    @model_serializer(mode="wrap")
    def _without_unset_extras(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if not data.get("retrieved"):  # a result dumps exactly as before the bank and sampling existed
            data.pop("retrieved", None)
        if data.get("sample") is None:
            data.pop("sample", None)
        for key in ("skills_loaded", "files_read"):
            if not data.get(key):
                data.pop(key, None)
        return data

    def all_calls(self) -> list[CallRef]:
        return ([self.call] if self.call is not None else []) + list(self.calls)


class SplitScore(Frozen):
    hard: float
    soft: float
    n: int


class Scores(Frozen):
    hard: float
    soft: float
    gate: float  # the gate metric's value (plus the semantic-density bonus, if any)
    n: int
    density: float = 0.0  # share of the skill's lines led by MUST/ALWAYS/NEVER-style words
    length_cost: float = 0.0  # the length penalty subtracted in `gate` (gate_length_penalty; fixed on fork)
    by_task_type: dict[str, SplitScore] = Field(default_factory=dict)


class MergeCall(Frozen):
    level: int
    side: str  # failure | success | final
    inputs: int
    status: str  # ok | fallback
    call: CallRef | None = None


def usage_of(calls: list[CallRef | None]) -> dict[str, Usage]:
    """Usage per role of a list of calls."""
    out: dict[str, Usage] = {}
    for call in calls:
        if call is None:
            continue
        out[call.role] = out.get(call.role, Usage()) + Usage(
            calls=1, prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens
        )
    return out


class PairedTest(Frozen):
    """gate_rule paired: the one-sided exact sign test of the candidate
    against the current skill, item by item on the same selection items
    (each item's gate metric value, compared exactly)."""

    wins: int  # items the candidate scores above the current skill
    losses: int  # items it scores below it
    ties: int
    p_value: float  # P(at least `wins` heads in wins + losses fair coin flips)
    confidence: float  # passes when p_value <= 1 - confidence (compared exactly)
    passed: bool
    bound: bool = False  # rejected early: the best the unscored items could still give


class TypeGuard(Frozen):
    """gate_type_margin: per task type, how much the candidate loses against the current skill."""

    margin: float
    losses: dict[str, float]  # task type -> current minus candidate gate score (at least this, when `bound`)
    passed: bool  # no loss above the margin
    bound: bool = False  # rejected early: the losses are the least the unscored items could still give

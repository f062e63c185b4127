"""The events of the skill bank (`mode: bank`, SkillRL): skills distilled
from a step's trajectories, the bank seeded from imported trajectories,
validated per category and evolved. Registered with the others in
`skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from skillstate.bank.dedup import DroppedSkill
from skillstate.bank.skills import BankSkill, Mistake
from skillstate.log.events import Event
from skillstate.log.values import CallRef, Scores, Usage, usage_of


class SkillsDistilled(Event):
    """The teacher read a step's trajectories and proposed skills; those that
    survived deduplication are in the bank `skill` (its JSON blob), which is
    the current skill from here on. Not gated: the bank is validated and
    evolved every `bank.validation_interval` steps."""

    type: ClassVar[str] = "SkillsDistilled"
    step: int
    base_skill: str  # the bank before
    skill: str  # the bank after (== base_skill when nothing was added)
    status: str  # ok | unparseable | error
    added: list[BankSkill] = Field(default_factory=list)
    dropped: list[DroppedSkill] = Field(default_factory=list)
    mistakes: list[Mistake] = Field(default_factory=list)
    call: CallRef | None = None

    def blob_refs(self) -> list[str]:
        return [self.base_skill, self.skill]

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class BankSeeded(Event):
    """Before the baseline: the teacher distilled the imported trajectories
    (`RunStarted.trajectories`) into the bank `skill`, which the baseline
    then scores and the steps start from."""

    type: ClassVar[str] = "BankSeeded"
    base_skill: str
    skill: str
    statuses: list[str]  # per teacher call: ok | unparseable | error
    added: list[BankSkill] = Field(default_factory=list)
    dropped: list[DroppedSkill] = Field(default_factory=list)
    mistakes: list[Mistake] = Field(default_factory=list)
    calls: list[CallRef] = Field(default_factory=list)

    def blob_refs(self) -> list[str]:
        return [self.base_skill, self.skill]

    def usage(self) -> dict[str, Usage]:
        return usage_of(list(self.calls))


class BankValidated(Event):
    """The current bank scored on the selection split, per category; its
    score becomes the current score (and the best when it beats it).

    With `bank.gate_distillation`, the bank is compared with `checked`, the
    bank last validated and kept (or accepted by the gate), whose gate score
    is `checked_score`: when it scores lower (`kept` false), the skills
    distilled since are dropped and `checked` is the current bank again,
    with its score. `kept` None: no comparison (the bank is the one last
    validated, or the run predates the rule)."""

    type: ClassVar[str] = "BankValidated"
    step: int
    split: str
    skill: str
    scores: Scores
    cached: bool = False
    results: str | None = None
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)
    checked: str | None = None
    checked_score: float | None = None
    kept: bool | None = None

    def blob_refs(self) -> list[str]:
        return [self.skill] + ([self.results] if self.results else []) + ([self.checked] if self.checked else [])

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class BankEvolved(Event):
    """The evolution of the bank: the categories below the threshold, the
    failures the teacher was shown, and what it added. With something added,
    a `CandidateBuilt` follows and the candidate bank goes through the gate."""

    type: ClassVar[str] = "BankEvolved"
    step: int
    rates: dict[str, float]
    categories: list[str]  # below the threshold, worst first
    samples: dict[str, list[str]] = Field(default_factory=dict)  # category -> failed item ids shown
    source: str = "val"  # the split the failures shown came from (bank.evolve_from; val before it existed)
    status: str  # ok | unparseable | error | skipped (no category below the threshold) | no_failures (none to show)
    added: list[BankSkill] = Field(default_factory=list)
    dropped: list[DroppedSkill] = Field(default_factory=list)
    call: CallRef | None = None

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])

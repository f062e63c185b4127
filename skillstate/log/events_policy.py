"""The events of a policy training run (RunStarted kind `policy`: `skillstate
sft`, `skillstate grpo`): what was trained from what, every metric TRL
logged, each checkpoint, and, for GRPO, each validation of the policy and
each evolution of the bank during training (SkillRL's Algorithm 1).
Registered with the others in `skillstate.log.event_codec`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from skillstate.bank.dedup import DroppedSkill
from skillstate.bank.skills import BankSkill
from skillstate.log.events import Event
from skillstate.log.values import CallRef, Frozen, Scores, Usage, usage_of


class ModelIdentity(Frozen):
    """A model directory: where it was, and the SHA-256 of its files (each relative name and content)."""

    path: str
    sha256: str
    files: int


class PolicyStarted(Event):
    """Right after RunStarted: the base model, the data and the trainer's settings."""

    type: ClassVar[str] = "PolicyStarted"
    method: str  # sft | grpo
    base_model: ModelIdentity
    source_run: str | None = None  # the run the data (sft) or the bank (grpo) came from
    dataset: str | None = None  # sft: the blob of the training rows (JSON lines); grpo: None (built from the bank)
    dataset_sha256: str | None = None
    dataset_rows: int = 0
    trainer_config: dict[str, Any] = Field(default_factory=dict)  # TRL's arguments and the LoRA settings
    output_dir: str
    library_versions: dict[str, str] = Field(default_factory=dict)  # torch, transformers, trl, peft

    def blob_refs(self) -> list[str]:
        return [self.dataset] if self.dataset else []


class Checkpoint(Frozen):
    step: int
    path: str
    sha256: str  # of the adapter (or the weights) written, file by file


class PolicyTrained(Event):
    """Steps `step_from` (exclusive) to `step_to` trained: every metric TRL logged, by step, and the checkpoint
    written at `step_to`. For GRPO, `bank` is the bank the prompts were built with."""

    type: ClassVar[str] = "PolicyTrained"
    step_from: int
    step_to: int
    metrics: list[dict[str, float]] = Field(default_factory=list)  # each has "step"
    checkpoint: Checkpoint
    bank: str | None = None
    prompts_sha256: str | None = None  # grpo: the training prompts of this stretch
    seconds: float = 0.0

    def blob_refs(self) -> list[str]:
        return [self.bank] if self.bank else []


class PolicyValidated(Event):
    """The policy at `step` scored on the selection split with the current bank, per category."""

    type: ClassVar[str] = "PolicyValidated"
    step: int
    split: str
    skill: str  # the bank
    scores: Scores
    results: str | None = None  # the ItemResult list's blob

    def blob_refs(self) -> list[str]:
        return [self.skill] + ([self.results] if self.results else [])


class PolicyBankEvolved(Event):
    """Recursive evolution at `step`: the categories below the threshold, the train failures (of the policy)
    the teacher was shown, what it added, and the gate on val: the evolved bank is kept only when the policy
    scores strictly better with it."""

    type: ClassVar[str] = "PolicyBankEvolved"
    step: int
    rates: dict[str, float]
    categories: list[str]
    samples: dict[str, list[str]] = Field(default_factory=dict)
    status: str  # ok | unparseable | error | skipped (none below the threshold) | no_failures (none to show)
    added: list[BankSkill] = Field(default_factory=list)
    dropped: list[DroppedSkill] = Field(default_factory=list)
    call: CallRef | None = None
    base_skill: str
    candidate: str | None = None
    base_score: float | None = None
    candidate_score: float | None = None
    accepted: bool = False
    failures: str | None = None  # the blob of the train results the failures came from
    candidate_results: str | None = None

    def blob_refs(self) -> list[str]:
        return [b for b in (self.base_skill, self.candidate, self.failures, self.candidate_results) if b]

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])

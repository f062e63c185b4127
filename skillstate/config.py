"""The run configuration: one pydantic model holding every knob. Keys the
spec names keep the spec's names and defaults. Validation with one-line
errors, the keys a resume may change and the views of a config stored in
the log are `skillstate.config_views`; reading a config from files and
`key=value` overrides is `skillstate.config_sources`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from skillstate.config_parts import (  # noqa: F401  (re-exported: the sections are config's names too)
    EXTRA_BODY_TAKEN,
    BankConfig,
    EpisodeConfig,
    JudgeModelConfig,
    ModelConfig,
    OptimizerModelConfig,
    PolicyConfig,
    SimConfig,
    TargetModelConfig,
)
from skillstate.config_section import Section, is_stored
from skillstate.errors import ConfigError
from skillstate.skillopt.final_selection import FinalSelectionConfig
from skillstate.util import redact  # noqa: F401  (re-exported: callers import it from here)

Backend = Literal["sim", "openai"]
Scheduler = Literal["constant", "linear", "cosine"]
GateMetric = Literal["hard", "soft", "mixed"]

SIM_MODELS = {"target": "sim-target", "optimizer": "sim-optimizer", "judge": "sim-judge"}

# What mode bank leaves off of the document mechanisms that are on by default.
BANK_OFF: dict[str, Any] = {"blocker_search": "off", "prune": "off", "edit_screen": "off"}


class SkillConfig(Section):
    """Every knob of a SkillOpt run. Field names are the config keys."""

    # where things come from
    env: str = Field("qa", description="The environment: a built-in name (qa), a name an installed package "
                                       "registers under the entry point group skillstate.envs, or "
                                       "python:MODULE:CLASS.")
    env_config: dict[str, Any] = Field(default_factory=dict, description="The environment's own settings, "
                                       "validated by its config model and stored in the log.")
    backend: Backend = Field(
        "sim", description="LLM backend for both roles: sim (offline simulation) or openai (any OpenAI-compatible "
                           "endpoint).")
    data: str | None = Field(
        None, description="Dataset directory with train/val/test .jsonl; with backend sim and no data, the bundled "
                          "simulated world.")
    initial_skill: str | None = Field(
        None, description="The starting skill: a markdown file, or an Agent Skills directory (or its SKILL.md, or a "
                          ".skill/.zip archive), whose SKILL.md is trained with its front matter protected; "
                          "default: the environment's.")
    optimizer: OptimizerModelConfig = Field(default_factory=OptimizerModelConfig)
    target: TargetModelConfig = Field(default_factory=TargetModelConfig)
    judge: JudgeModelConfig = Field(default_factory=JudgeModelConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    mode: Literal["skill", "bank"] = Field(
        "skill", description="skill: train one skill document (SkillOpt); bank: grow a bank of small skills "
                             "retrieved per task (SkillRL).")
    bank: BankConfig = Field(default_factory=BankConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    final_selection: FinalSelectionConfig = Field(default_factory=FinalSelectionConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)

    # training schedule
    num_epochs: int = Field(
        4, ge=1, le=100_000, description="Epochs; steps per epoch = ceil(train / (batch_size * accumulation)).")
    batch_size: int = Field(40, ge=1, description="Train items rolled out per step.")
    minibatch_size: int = Field(8, ge=1, description="Trajectories per analyst call.")
    max_calls: int | None = Field(
        None, ge=1, description="No step starts once the run's LLM calls (all roles, as its events count them) "
                                "reach this many; the run goes on to its final selection and tests. Unset: every "
                                "step of num_epochs runs.")
    merge_batch_size: int = Field(8, ge=2, description="Patches per merge call in the merge tree.")

    # edit budget (textual learning rate)
    edit_budget: int = Field(4, ge=1, description="Maximum edits kept per step.")
    min_edit_budget: int = Field(2, ge=1, description="The scheduler never goes below this.")
    lr_scheduler: Scheduler = Field(
        "cosine", description="The edit budget's schedule, from edit_budget down to min_edit_budget: constant, linear "
                              "or cosine.")

    # gate
    gate_metric: GateMetric = Field(
        "hard", description="What the gate compares: hard, soft (token F1) or mixed ((1 - w) * hard + w * soft, w = "
                            "gate_mixed_weight).")
    gate_mixed_weight: float = Field(0.5, ge=0.0, le=1.0, description="w in (1-w)*hard + w*soft for gate_metric mixed.")
    gate_rule: Literal["strict", "paired"] = Field(
        "strict", description="strict: accept a candidate scoring strictly above the current skill; paired: also "
                              "require its per-item gain on the same items to pass a one-sided exact sign test at "
                              "gate_confidence.")
    gate_confidence: float = Field(
        0.9, ge=0.5, lt=1.0, description="gate_rule paired: the sign test's level (accept when its p-value is at "
                                         "most 1 - gate_confidence).")
    gate_type_margin: float | None = Field(
        None, ge=0.0, le=1.0, description="Reject a candidate whose gate score on any task type is below the current "
                                          "skill's by more than this; unset: no per-type guard.")
    gate_length_penalty: float = Field(
        0.0, ge=0.0, le=1.0, description="Subtract this from the gate metric per 100 characters of the skill, so a "
                                         "shorter skill that scores the same wins (fixed on fork).")

    # robust learning on noisy targets (docs/noisy-targets.md): prune, repair, blocker search, screens, parents
    prune: Literal["off", "epoch", "step"] = Field(
        "epoch", description="Propose deleting lines that do not earn their place (duplicates, near-duplicates, what "
                             "the prune prompt names) at each epoch end or after each step, decided by the gate "
                             "(not in mode bank; runs logged before it was the default read off).")
    prune_max_lines: int = Field(6, ge=1, description="prune: the most lines one proposal deletes.")
    prune_blockers: bool = Field(
        False, description="prune: also take the current skill's lowest task type on val (at most half right), "
                           "remove each line (and clause) of the skill in turn on its failed val items, and "
                           "propose deleting the line whose removal lifts them, when that lift stands out (runs "
                           "logged while it was the default read true, those before false).")
    repair: Literal["off", "ablate"] = Field(
        "ablate", description="ablate: when a candidate loses some task types while lifting others, remove its kept "
                           "edits one at a time on the lost types' items, drop those whose removal recovers them, "
                           "and gate the candidate without them (update_mode patch).")
    repair_max_edits: int = Field(3, ge=1, description="repair ablate: at most this many edits ablated per step.")
    repair_full_evaluation: bool = Field(
        True, description="repair ablate, with repair_prefix off: score a candidate the repair may examine on every "
                          "val item (no early reject), so the repair and the gate decide as a full evaluation "
                          "would; false: early reject applies (fewer calls, and the repair pairs only the items "
                          "scored).")
    repair_clauses: bool = Field(
        True, description="repair ablate: also ablate each clause (sentence, clause after a semicolon, line) of "
                           "an ablated edit that joins two or more, so an edit that pairs a helpful rule with a "
                           "harmful one can be kept without the harmful part; more ablation calls.")
    repair_prefix: bool = Field(
        True, description="repair ablate: pair the candidate with the current skill only on the val items early "
                           "reject scores before it stops (every item when it does not), whether early reject is "
                           "on or not; early reject then applies to the candidates the repair examines "
                           "(`repair_full_evaluation` is not needed), for fewer calls and the same decisions "
                           "either way.")
    repair_type_loss: float = Field(
        0.3, ge=0.0, le=1.0, description="repair ablate: a task type is repaired when the candidate's mean gate "
                                         "score on it is below the current skill's by more than this.")
    blocker_search: Literal["off", "step"] = Field(
        "step", description="step: when a step's candidate does not beat the current skill and leaves a task type "
                           "its edits were aimed at failing, remove each line (and clause) of the current skill from "
                           "the candidate in turn, roll it out on that type's failed val items, and gate the "
                           "candidate without the line whose removal lifts them, when that lift stands out "
                           "(update_mode patch; not in mode bank; runs logged before it was the default read off).")
    blocker_items: int = Field(6, ge=1, description="blocker_search: the most failed items of the type each "
                                                     "ablation is rolled out on.")
    blocker_max_lines: int = Field(8, ge=1, description="blocker_search: the most lines of the current skill "
                                                         "ablated per search (those that arrived when the type's "
                                                         "score fell the most first), each whole and by clause.")
    blocker_ablation: Literal["each", "group"] = Field(
        "group", description="How blocker_search and prune_blockers roll out their ablations. group: a few items "
                             "at a time, each ablation stopped once it could no longer lift half the items; the "
                             "step's search first removes every searched line of one clause at once and ablates "
                             "those one by one only when that lifts half the items (fewer calls); each: every "
                             "ablation on every item (runs logged before group was the default read each).")
    blocker_stop_by_line: bool = Field(
        True, description="blocker_ablation group: stop an ablation only once no ablation of its line (the whole "
                          "line or a clause) could still lift half the items, so the clause chosen over its line "
                          "is the one every ablation rolled out on every item would give (runs logged before it "
                          "existed read false: each ablation stopped on its own).")
    blocker_screened: bool = Field(
        True, description="blocker_search: when no type the kept edits were aimed at is left failing, take an "
                          "edit the screen left out, aimed at a type the candidate leaves failing, and search the "
                          "lines of the current skill with that edit alone (a rule that wins nothing while another "
                          "line overrides its type is screened out, so the search would never see it; runs logged "
                          "before it existed read false).")
    edit_screen: Literal["off", "minibatch"] = Field(
        "minibatch", description="minibatch: before selection, apply each merged edit alone to the current skill and "
                                 "roll it out on a few failures its analysts were shown, of the types their summary "
                                 "names, and on one solved item of another type; only the edits that win back more "
                                 "than half the failures of one type, net, and gain overall compete for the budget, "
                                 "by their gain, with no ranking call; when none passes, see edit_screen_fallback "
                                 "(update_mode patch; not in mode bank; runs logged before it was the default read "
                                 "off).")
    edit_screen_items: int = Field(2, ge=1, description="edit_screen minibatch: the failures of each aimed type (at "
                                                        "most two types) an edit is tried on.")
    edit_screen_others: int = Field(1, ge=0, description="edit_screen minibatch: the items of other types, which "
                                                         "the current skill got right, an edit is also tried on.")
    edit_screen_early: bool = Field(
        True, description="edit_screen minibatch: try an edit on one failure of each of its types first, and on the "
                          "rest of its minibatch only while it could still pass (the same edits pass, with the same "
                          "gains, for fewer calls; runs logged before it existed read false).")
    edit_screen_fallback: Literal["none", "rank"] = Field(
        "rank", description="edit_screen minibatch: the selection when no edit passes its minibatch. rank: the "
                            "optimizer ranks the edits as it would without the screen, so rules that gain only "
                            "together or only sometimes (an episode's steps) still reach the gate; none: nothing "
                            "is selected and the step is skipped (runs logged before it existed read none).")
    parent_selection: Literal["current", "pareto", "items"] = Field(
        "current", description="current: each step builds on the current skill; pareto: on a skill drawn from the "
                               "front of those accepted so far (and the initial one), each leading some task type on "
                               "val, weighted by how many it leads; items: the same front taken per val item, as "
                               "GEPA's (not in mode bank).")
    minibatch_gate: bool = Field(
        False, description="Before validation, roll the candidate out on the step's own batch: unless its summed "
                           "item values there beat its parent's rollout strictly, the gate rejects it with no "
                           "validation call (GEPA's acceptance test, made for small batches such as batch_size "
                           "3; a candidate rebuilt by the repair or the blocker search is not checked again; one "
                           "rejected here is never put before a person under review, having no val score; not in "
                           "mode bank).")

    # the rest
    use_gate: bool = Field(
        True, description="false: every candidate is accepted (recorded as a forced accept); it is still scored.")
    review: Literal["off", "accepted", "new_best", "all"] = Field(
        "off", description="A person in the loop: once the gate has decided a step of this kind (accepted: every "
                           "accepted step; new_best: those that beat the best; all: every step with a changed "
                           "candidate, rejected ones too), the run records ReviewRequested and stops (status "
                           "awaiting_review, exit code 5) until `skillstate review` decides it; then `skillstate "
                           "resume` goes on (runs logged before it existed read off; not in mode bank).")
    review_timeout: float | None = Field(
        None, ge=0, description="With review: wait this many seconds from the request for a decision (the driver "
                                "stays up and polls), then record review_default as decided by `timeout`; unset: "
                                "stop at once and wait for a person.")
    review_default: Literal["reject", "accept"] = Field(
        "reject", description="review_timeout: the decision recorded when no person decided in time (accept keeps "
                              "the gate's verdict, reject keeps the current skill).")
    drop_noop_edits: bool = Field(
        True, description="Before selection, drop merged edits that would change nothing (a line the skill already "
                          "holds, an absent target, a duplicate), so the budget goes to edits that do.")
    keep_links_whole: bool = Field(
        True, description="A run that trains a skill directory: selection never leaves a link in SKILL.md pointing "
                          "at a file the candidate does not hold; the edit that creates the file joins the edit "
                          "that links to it, else that edit is left out (runs logged before it existed read false).")
    drop_rejected_edits: int = Field(
        2, ge=0, description="With drop_noop_edits, also drop before selection a merged edit that was in this many "
                             "rejected candidates of the run (an edit the repair dropped as harmful counts as one); "
                             "0: never.")
    early_reject: bool = Field(
        True, description="Stop scoring a candidate once it cannot beat the current score even if every item left "
                          "succeeded (the decision is the same as a full evaluation's; the items the current skill "
                          "failed are scored first).")
    protect_front_matter: bool = Field(
        True, description="Keep the YAML front matter that opens the skill (an Agent Skills SKILL.md's name and "
                          "description) out of every edit, rewrite and full rewrite, and put it back unchanged "
                          "(runs logged before it existed read false).")
    disclosure: Literal["inline", "tools"] = Field(
        "inline", description="How the target sees an Agent Skills skill. inline: SKILL.md is its system prompt (a "
                              "target without tool calling); tools: progressive disclosure, as agents install "
                              "skills: the system prompt lists each installed skill's name and description, and the "
                              "target loads a body with load_skill and a file with read_skill_file (question "
                              "answering environments; the optimizer may then also edit the description).")
    distractor_skills: tuple[str, ...] = Field(
        (), description="With disclosure tools, more Agent Skills directories (or archives) "
                                          "installed beside the trained one and never edited, as a user's "
                                          ".claude/skills/ holds several (a list of paths; one path alone "
                                          "counts as a list of one); each is stored in the run's log.")
    disclosure_max_calls: int = Field(
        8, ge=2, le=64, description="With disclosure tools, the most target calls one rollout may make (the calls "
                                    "that load skills and read files included); a rollout that has not answered "
                                    "by then fails (max_calls).")
    train_files: Literal["auto", "skill_md", "all"] = Field(
        "auto", description="What a run of an Agent Skills directory trains. skill_md: SKILL.md alone, the other "
                            "files kept as read; all: every text file, with edits that name a file and create or "
                            "remove references (needs disclosure tools, where the target reads them); auto: all "
                            "with disclosure tools, else skill_md. Fixed when the run is created.")
    eval_order: Literal["failed_first", "hardness", "split"] = Field(
        "hardness", description="The order early reject scores val items in: failed_first, those the current "
                                "skill failed first; hardness, within each of those groups the items that the "
                                "skills made current so far (the initial one included) failed most often first "
                                "(fewer items to a reject; with repair_prefix the repair pairs that prefix, the "
                                "same whether early reject is on or off); split, the split's own order (the "
                                "decisions are the same in every order; runs logged before hardness was the "
                                "default read failed_first).")
    early_reject_slow_update: bool = Field(
        True, description="With early_reject, also stop scoring a gated slow update (slow_update_gate) once it "
                          "cannot beat the current score.")
    overlap_start: bool = Field(
        True, description="While the baseline is scored, roll out the first step's batch and score the initial skill "
                          "on test too (each is needed later; it is served from the call table then).")
    speculative_rollout: bool = Field(
        False, description="While a step's later stages run, roll out the next step's batch under the current skill; "
                           "an accepted candidate makes those calls unused (the summary counts them).")
    semantic_density_weight: float = Field(
        0.0, ge=0.0, description="Gate bonus per unit share of skill lines led by MUST/ALWAYS/NEVER-style words.")

    # full SkillOpt
    use_step_buffer: bool = Field(
        True, description="Show the analysts, the autonomous learning rate and the rewrite call the earlier steps of "
                          "the epoch (actions, failure patterns, rejected edits).")
    lr_control: Literal["fixed", "autonomous"] = Field(
        "fixed", description="fixed: the scheduler's edit budget; autonomous: the optimizer chooses how many edits to "
                             "apply.")
    update_mode: Literal["patch", "rewrite", "full_rewrite"] = Field(
        "patch", description="patch: apply edits; rewrite: one call rewrites the skill from the kept suggestions; "
                             "full_rewrite: analysts write whole skills that the merges combine (no budget).")
    accumulation: int = Field(
        1, ge=1, description="Sub-batches per step, rolled out and reflected separately, pooled for "
                             "aggregate/select/update.")
    use_slow_update: bool = Field(
        False, description="At each epoch end from epoch 2, compare the previous and current skill and rewrite the "
                           "protected guidance block.")
    slow_update_samples: int = Field(
        20, ge=1, description="Train items rolled out with both skills for the epoch comparison.")
    longitudinal_pair_policy: Literal["mixed", "changed", "unchanged"] = Field(
        "mixed", description="Which compared items the slow update and meta skill see: all, improved+regressed, or the "
                             "stable ones.")
    slow_update_gate: bool = Field(
        False, description="Pass the slow update through the gate instead of forcing it into the current skill.")
    use_meta_skill: bool = Field(
        False, description="At each epoch end from epoch 2, write a memo to the optimizer, prepended to its analyst, "
                           "merge and rank prompts.")

    # cost
    max_cost_usd: float | None = Field(
        None, gt=0, description="Stop cleanly once the LLM requests this run sent cost this much (resumable with a "
                                "higher budget).")

    samples: int = Field(
        1, ge=1, le=64, description="An evaluation run's samples per item: with G > 1, G distinct requests per item "
                                    "(seed 0..G-1; set target.temperature above 0), for GRPO groups (export-grpo).")

    # stop conditions: each stops cleanly at an event boundary, is recorded (StopConditionMet) and resumable
    stop_after_no_improvement: int | None = Field(
        None, ge=1, description="Stop before a step once the best score has not improved for this many steps (a "
                                "fork counts from its fork step).")
    target_score: float | None = Field(
        None, description="Stop before a step once the best score (gate metric) reaches this value (scores are "
                          "from 0 to 1).")
    max_wall_seconds: float | None = Field(
        None, gt=0, description="Stop at the next event boundary once this invocation has run this many seconds.")
    stop_file: str | None = Field(
        None, description="Stop at the next event boundary while this file exists (delete it, then resume).")
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Extra or overriding prices: model -> [USD per 1M input tokens, USD per 1M "
                                          "output tokens].")

    failure_only: bool = Field(False, description="Ignore successes in Reflect.")
    seed: int = Field(42, description="Seeds every shuffle.")
    train_split: str = Field("train", description="The split the batches are drawn from.")
    val_split: str = Field("val", description="The selection split the gate scores on.")
    test_split: str = Field("test", description="The split the initial and best skill are scored on at the end "
                                                "(eval_test).")
    eval_test: bool = Field(True, description="Score the initial and best skill on the test split at the end.")
    eval_without_skill: bool = Field(
        True, description="With eval_test, an environment graded by a judge (env evals) also scores the target "
                          "with no skill on test, so the run says what the skill adds over none.")
    concurrency: int = Field(8, ge=1, description="LLM calls in flight at once.")
    executor: Literal["threads", "ray"] = Field(
        "threads", description="Where rollouts and evaluations run: threads (in this process) or ray (Ray tasks on a "
                               "pool of environment actors; the ray extra). The driver still journals every call and "
                               "appends every event, so the events are the same.")
    ray_address: str | None = Field(
        None, description="executor ray: the cluster to join (auto, or ray://HOST:10001); unset starts a local one.")
    ray_num_cpus: float = Field(
        1.0, ge=0, description="executor ray: CPUs each environment actor reserves (0 for an environment that only "
                               "waits on the endpoint); there are min(concurrency, cluster CPUs / this) actors.")
    max_consecutive_failures: int = Field(
        16, ge=0, description="Circuit breaker: stop the run (resumable) after this many failed LLM calls in a row; 0 "
                              "turns it off.")
    max_stage_failure_share: float = Field(
        0.5, gt=0.0, le=1.0, description="Circuit breaker: stop the run (resumable) when more than this share of a "
                                         "stage's LLM calls (sent or served from the log) failed, once it sent at "
                                         "least 4; 1.0 turns it off.")
    prompts: dict[str, str] = Field(
        default_factory=dict, description="Prompt overrides: name -> markdown file or inline text.")
    llm_cache: Literal["all", "lineage"] = Field(
        "all", description="Serve identical LLM requests from any run in the database (all) or only from this run and "
                           "its fork ancestors (lineage).")

    @field_validator("prices")
    @classmethod
    def _real_prices(cls, prices: dict[str, tuple[float, float]],
                     info: ValidationInfo) -> dict[str, tuple[float, float]]:
        if is_stored(info):
            return prices
        for model, price in prices.items():
            if not model.strip():
                raise ValueError("a model name must not be empty")
            if not all(math.isfinite(p) and p >= 0 for p in price):
                raise ValueError(f"the price of {model!r} must be two numbers of USD of 0 or more, got "
                                 f"{list(price)}")
        return prices

    @field_validator("prune", "repair", "blocker_search", "edit_screen", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return "off" if value is False else value  # `--set prune=off` reads as YAML's false

    @field_validator("distractor_skills", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value  # `--set distractor_skills=DIR`

    @field_validator("target_score")
    @classmethod
    def _a_score(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0 and not is_stored(info):
            raise ValueError(f"scores are from 0 to 1, got {value}")
        return value

    @field_validator("review", mode="before")
    @classmethod
    def _review_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # `--set review=off` reads as YAML's false

    @model_validator(mode="before")
    @classmethod
    def _bank_leaves_the_document_mechanisms_off(cls, data: Any) -> Any:
        """In mode bank, the mechanisms that edit one document and are on by default (the blocker search, the
        prune) read off unless the config names them (then the check below refuses them)."""
        if isinstance(data, dict) and data.get("mode") == "bank":
            data = {**{key: off for key, off in BANK_OFF.items() if key not in data}, **data}
        return data

    @model_validator(mode="after")
    def _review_of_one_document(self) -> SkillConfig:
        if self.review != "off" and self.mode == "bank":
            raise ValueError("mode bank grows a bank of skills, not one document: review does not apply to it "
                             "(leave it at its default)")
        return self

    @model_validator(mode="after")
    def _check(self) -> SkillConfig:
        if self.min_edit_budget > self.edit_budget:
            raise ValueError(f"min_edit_budget ({self.min_edit_budget}) is larger than edit_budget "
                             f"({self.edit_budget})")
        splits = [self.train_split, self.val_split, self.test_split]
        if len(set(splits)) != 3:
            raise ValueError(f"train, val and test splits must differ, got {splits}")
        if self.sim.model_suffix() and self.backend == "sim" and self.env != "qa":
            raise ValueError(f"the sim's noisy mode (sim.*) plays question answering (env qa) only, not env "
                             f"{self.env!r}: leave sim.noise off")
        if self.mode == "bank":
            clash = [key for key, on in (("use_slow_update", self.use_slow_update),
                                         ("use_meta_skill", self.use_meta_skill),
                                         ("accumulation", self.accumulation != 1),
                                         ("lr_control", self.lr_control != "fixed"),
                                         ("update_mode", self.update_mode != "patch"),
                                         ("prune", self.prune != "off"),
                                         ("prune_blockers", self.prune_blockers),
                                         ("blocker_search", self.blocker_search != "off"),
                                         ("edit_screen", self.edit_screen != "off"),
                                         ("parent_selection", self.parent_selection != "current"),
                                         ("minibatch_gate", self.minibatch_gate)) if on]
            if clash:
                raise ValueError(f"mode bank grows a bank of skills, not one document: {clash[0]} does not apply "
                                 "to it (leave it at its default)")
            if self.bank.embedder == "openai" and self.backend == "sim" and not self.optimizer.base_url:
                raise ValueError("bank.embedder openai calls an embeddings endpoint: with backend sim, set "
                                 "optimizer.base_url to one, or use bank.embedder sim offline")
        return self

    def model_for(self, role: str) -> str:
        cfg: ModelConfig = getattr(self, role)
        if cfg.model:
            return cfg.model
        if self.backend == "sim":
            if role == "judge":  # its own name: a sim judge's verdicts depend on its error rate
                return SIM_MODELS[role] + (f"-err{self.sim.judge_error:g}" if self.sim.judge_error else "")
            return SIM_MODELS[role] + self.sim.model_suffix()
        if role == "judge" and self.optimizer.model:
            return self.optimizer.model
        raise ConfigError(f"backend openai needs a model for the {role}: pass --model, --{role}-model or --set "
                          f"{role}.model=NAME")

    def role_config(self, role: str) -> ModelConfig:
        """How `role` reaches its model: its own section, except that the judge's unset endpoint keys are the
        optimizer's (with no base_url of its own, it uses the optimizer's endpoint as a whole)."""
        if role != "judge":
            return getattr(self, role)
        judge, opt = self.judge, self.optimizer
        own = judge.base_url is not None
        return judge.model_copy(update={
            "base_url": judge.base_url if own else opt.base_url,
            "api_key_env": judge.api_key_env or opt.api_key_env,
            "azure": judge.azure if own else opt.azure,
            "api_version": judge.api_version if own else opt.api_version,
        })

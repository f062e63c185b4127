"""The config's sections below the top level (`skillstate.config` holds
`SkillConfig`, which nests them): how each role reaches its model, how
episodes run, the skill bank, and the sim's noisy mode."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from skillstate.config_section import Section
from skillstate.util import redact

# extra_body field names that hold a credential, which the journal must never keep.
_CREDENTIAL_KEY = re.compile(r"(^|[_-])(api_?key|key|token|secret|password|passwd|authorization|auth|cookie|"
                             r"credentials?)($|[_-])", re.IGNORECASE)

# Request fields skillstate sets itself; a role's `extra_body` may not override them.
EXTRA_BODY_TAKEN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "response_format",
                    "tools", "seed", "stream", "n"}


class ModelConfig(Section):
    """How one role (target or optimizer) reaches its model."""

    model: str | None = Field(None, description="Model name; the sim backend defaults to sim-target / sim-optimizer.")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    azure: bool = Field(False, description="Use Azure OpenAI (base_url is the Azure endpoint).")
    api_version: str | None = Field(None, description="Azure API version.")
    temperature: float | None = Field(
        0.0, ge=0.0, le=2.0, description="Sampling temperature; null leaves it to the server.")
    max_tokens: int = Field(1024, ge=1, description="Completion token limit per call.")
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens", description="Request field for the token limit (newer OpenAI models want max_completion_tokens).")
    timeout: float = Field(
        600.0, gt=0, description="Seconds one attempt of a request may take before it is retried (generous, so a slow "
                                 "local model on a CPU works out of the box).")
    max_retries: int = Field(
        4, ge=0, description="Retries on 408/409/429/5xx and connection errors (Retry-After honoured).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="More fields for each request body, sent as they are: a server's own "
                                          "sampling knobs, e.g. {repeat_penalty: 1.1} for llama.cpp. Part of the "
                                          "journaled request (and its hash).")

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & EXTRA_BODY_TAKEN)
        if taken:
            raise ValueError(f"{taken[0]!r} is set by skillstate itself (use the role's own keys)")
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"not plain JSON data ({err})") from None
        named = sorted(k for k in value if _CREDENTIAL_KEY.search(k))
        if named or redact(text) != text:
            what = f"{named[0]!r} looks like a credential" if named else "a value looks like a credential"
            raise ValueError(f"{what}: extra_body is journaled with every request, so it must hold no secret "
                             "(give the key through api_key_env)")
        return value


class TargetModelConfig(ModelConfig):
    max_tokens: int = Field(512, ge=1, description="Completion token limit per call.")
    check_tools: bool = Field(
        True, description="For an environment whose target calls tools: before the run, ask the endpoint to call "
                          "a test tool, and refuse one that cannot. false runs anyway (the summary then says how "
                          "many tool calls the target made).")


class OptimizerModelConfig(ModelConfig):
    max_tokens: int = Field(4096, ge=1, description="Completion token limit per call.")
    response_format: Literal["text", "json_object", "json_schema"] = Field(
        "text", description="Ask the server for structured output: json_object, or json_schema with the reply schema "
                            "of each prompt (OpenAI, vLLM and llama.cpp accept both); text sends no response_format.")


class JudgeModelConfig(ModelConfig):
    """The judge (env evals): grades an output's expectations and llm-rubric assertions. Its endpoint keys
    left unset are the optimizer's, so one endpoint serves both unless the judge names its own."""

    model: str | None = Field(None, description="Model name; default: the optimizer's model.")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; default: the optimizer's (and then "
                                                   "its api_key_env, azure and api_version too).")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key; default: the "  # type: ignore[assignment]
                                                      "optimizer's.")
    max_tokens: int = Field(1024, ge=1, description="Completion token limit per call.")
    response_format: Literal["text", "json_object", "json_schema"] = Field(
        "text", description="Ask the server for structured output (json_object, or json_schema with the verdicts' "
                            "schema); text sends no response_format.")
    samples: int = Field(1, ge=1, le=15, description="Grade each output this many times (each a journaled call with "
                                                     "its own seed) and take the majority of each verdict; a tie "
                                                     "fails.")


class EpisodeConfig(Section):
    """How multi-turn episodes run and what the analysts see of them (text worlds and tool-using agents)."""

    max_turns: int = Field(50, ge=1, le=1000, description="Target calls per episode (actions, or tool-calling rounds).")
    max_invalid: int = Field(5, ge=1, description="This many invalid actions (or failed tool calls) in a row end the "
                                                  "episode as a failure.")
    history: int = Field(6, ge=0, description="Recent turns shown in full to the target each turn; all its earlier "
                                              "actions are always listed.")
    max_observation_chars: int = Field(2000, ge=100, description="Longer observations are cut in prompts (never in the "
                                                                 "stored trajectory).")
    reflect_last: int = Field(6, ge=1, description="Turns at the end of an episode that the analysts see.")
    reflect_score_changes: bool = Field(True, description="The analysts also see every turn where the score changed.")
    reflect_max_turns: int = Field(16, ge=1, description="At most this many turns of one episode in an analyst's "
                                                         "view.")


class BankConfig(Section):
    """The skill bank (mode: bank), after SkillRL: retrieval, deduplication and evolution."""

    retrieval: Literal["template", "embedding"] = Field(
        "template", description="template: the task category's skills plus the first general_k general ones; "
                                "embedding: the top_k most similar above similarity_threshold.")
    general_k: int = Field(6, ge=0, description="template retrieval: how many general skills every task gets.")
    top_k: int = Field(6, ge=1, description="embedding retrieval: at most this many skills per task.")
    similarity_threshold: float = Field(0.4, ge=-1.0, le=1.0, description="embedding retrieval: the cosine floor.")
    min_retrieved: int = Field(
        2, ge=0, description="embedding retrieval: every task gets at least this many of its most similar skills, "
                             "even below similarity_threshold (0: the paper's rule, which may give a task none).")
    query_category: bool = Field(
        True, description="embedding retrieval: the task's category is embedded with its description.")
    mistakes_k: int = Field(
        3, ge=0, description="Common mistakes per task: its category's and the general ones, most recent first "
                             "(0: every mistake in every prompt).")
    dedup_threshold: float = Field(
        0.85, gt=0.0, le=1.0, description="A new skill more similar than this to one in the bank is dropped.")
    max_new_skills: int = Field(3, ge=1, description="Skills one distill or evolve call may add.")
    validation_interval: int = Field(2, ge=1, description="Validate the bank (and evolve it) every N steps.")
    evolution_threshold: float = Field(
        0.4, ge=0.0, le=1.0, description="Categories whose validation success is below this are evolved.")
    evolve_samples: int = Field(8, ge=1, description="Failures shown to the teacher per evolution.")
    evolve_from: Literal["train", "val"] = Field(
        "train", description="Where the failures shown to the evolving teacher come from: train (the step's "
                             "rollouts) or val (the split the evolved bank is then gated on, which leaks it).")
    gate_distillation: bool = Field(
        True, description="At each validation, a bank that scores worse than the bank last validated is rolled "
                          "back to it (its distilled skills are dropped).")
    embedder: Literal["sim", "openai", "local"] = Field(
        "sim", description="sim: a deterministic offline embedder; openai: the embeddings API at the optimizer's "
                           "endpoint; local: all-MiniLM-L6-v2 on the CPU (extra embeddings). openai and local "
                           "vectors are journaled in the call table.")
    embedding_model: str = Field("text-embedding-3-small", description="The model of embedder openai.")
    embedding_batch: int = Field(
        128, ge=1, le=2048, description="Embedder openai or local: at most this many texts in one request (the "
                                        "texts a stage's retrievals need are sent together before its rollouts); "
                                        "lower it for a server with a smaller limit.")
    trajectories: str | None = Field(
        None, description="A JSON or JSONL file of trajectories in SkillRL's format to distill the bank from before "
                          "the baseline (snapshotted into the log).")


class SimConfig(Section):
    """The sim backend's noisy mode (question answering; see skillstate.sim.noise): every knob off by default."""

    noise: Literal["off", "moderate", "blocking"] = Field(
        "off", description="moderate: every knob below but blocking not set explicitly takes its moderate level; "
                           "blocking: the same, and blocking on too.")
    answer_noise: float = Field(0.0, ge=0.0, le=1.0, description="Share of the target's answers drawn from the "
                                "whole request (a one-word change of the skill draws again), not from the item alone.")
    harmful_edits: float = Field(0.0, ge=0.0, le=1.0, description="How often the optimizer proposes a rule that "
                                 "sounds right but breaks another task type.")
    harm_factor: float = Field(0.35, ge=0.0, le=1.0, description="What such a rule leaves of the chance of a right "
                               "answer on the task type it breaks.")
    paraphrases: float = Field(0.0, ge=0.0, le=1.0, description="How often the optimizer proposes a rule the skill "
                               "already has, in other words (longer, no better).")
    rank_noise: float = Field(0.0, ge=0.0, le=1.0, description="How little the select stage's ranking knows: 0 as "
                              "the clean sim, 1 at random.")
    length_penalty: float = Field(0.0, ge=0.0, le=1.0, description="Share of the chance of a right answer lost per "
                                  "100 characters of skill beyond length_free_chars.")
    length_free_chars: int = Field(600, ge=0, description="Skill length (characters) that costs nothing.")
    blocking: float = Field(0.0, ge=0.0, le=1.0, description="How often the optimizer, proposing the right rule for "
                            "a failing task type, proposes with it a broad line that overrides another task type "
                            "(pins it at block_level while the skill holds it, whatever else the skill says).")
    block_level: float = Field(0.1, ge=0.0, le=1.0, description="The chance of a right answer on a task type a "
                               "blocking line overrides.")
    judge_error: float = Field(0.0, ge=0.0, le=1.0, description="env evals: how often the sim judge gets a "
                               "verdict wrong (drawn from the request, so each sample draws on its own).")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("noise") in ("moderate", "blocking"):
            from skillstate.sim.noise import PRESETS

            data = {**PRESETS[data["noise"]], **data}
        return data

    def model_suffix(self) -> str:
        """What the sim's model names carry in the noisy mode, so its calls are never served to a clean run's
        requests from the call table (nor the other way round)."""
        from skillstate.sim.noise import SimNoise

        tag = SimNoise.of(self).tag()
        return f"-{tag}" if tag else ""


class PolicyConfig(Section):
    """Training the policy's weights with TRL (`skillstate sft`, `skillstate grpo`; the `train` extra): a
    local Hugging Face model, PEFT LoRA by default, checkpoints and metrics in the log."""

    base_model: str | None = Field(
        None, description="The policy to train: a local Hugging Face model directory (weights, config, tokenizer).")
    method: Literal["sft", "grpo"] = Field(
        "sft", description="sft: TRL's SFTTrainer on skill-augmented demonstrations; grpo: TRL's GRPOTrainer with the "
                           "environment's scorer as the reward (set by the command).")
    output_dir: str | None = Field(
        None, description="Where checkpoints are written (default: ./policy/RUN_ID).")
    max_steps: int = Field(20, ge=1, description="Optimizer steps in all.")
    save_steps: int = Field(10, ge=1, description="A checkpoint (and an event) every N steps; a crash resumes from "
                                                  "the last one.")
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="The optimizer's learning rate (constant).")
    batch_size: int = Field(4, ge=1, description="Rows per device step (grpo: completions, a multiple of "
                                                 "num_generations).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Device steps per optimizer step.")
    max_length: int = Field(1024, ge=16, description="sft: longest row, in tokens.")
    num_generations: int = Field(4, ge=2, description="grpo: completions sampled per prompt (the group G).")
    max_completion_length: int = Field(64, ge=1, description="grpo: longest completion, in tokens.")
    temperature: float = Field(1.0, gt=0.0, le=2.0, description="grpo: sampling temperature of the completions.")
    lora: bool = Field(True, description="Train a PEFT LoRA adapter (false: every weight).")
    lora_r: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha.")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    lora_target_modules: str = Field("all-linear", description="The modules LoRA adapts (PEFT's target_modules).")
    validation_interval: int = Field(
        10, ge=1, description="Every N steps (and before the first and after the last), the policy is scored on val "
                              "per category; grpo then evolves the categories below bank.evolution_threshold "
                              "(SkillRL's Algorithm 1).")
    evolve: bool = Field(True, description="grpo: evolve the bank during training (false: validate only).")
    eval_max_new_tokens: int = Field(64, ge=1, description="Longest reply when the policy is scored.")
    with_imported: bool = Field(
        False, description="sft: also train on the source run's imported trajectories (export-sft --with-imported).")
    torch_threads: int = Field(
        0, ge=0, description="CPU threads torch uses (0: its default). A small model on a busy machine is often "
                             "faster with 1.")

"""Creating runs: a new run from a config (validated, preflighted, its
dataset and prompts snapshotted into the log), or a fork of a run's state
after a step. A run row never exists without its first event."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillstate import __version__
from skillstate.config import SkillConfig, redact
from skillstate.config_sources import merge_overrides
from skillstate.config_views import public_config, validate_config
from skillstate.engine.loading import checked_prefix, lineage_events, new_run_id, roles_of, state_of, step_boundary
from skillstate.engine.skill_source import InitialSkill, is_skill_tree_path, read_initial_skill
from skillstate.envs import QAEnv, SkillEnv
from skillstate.envs.episode import EpisodeEnv
from skillstate.envs.registry import construct_env, env_settings, resolve_env
from skillstate.envs.tools import ToolEnv
from skillstate.errors import ConfigError, DataError, UserError
from skillstate.input_files import read_input_text
from skillstate.llm.base import FatalLLMError
from skillstate.log.events import Event, RunForked, RunStarted
from skillstate.prompts import PROMPT_NAMES, resolve_prompts
from skillstate.skillopt.final_selection import check_fork_selection, with_selection_split
from skillstate.skillopt.scheduler import steps_per_epoch
from skillstate.skilltree import EncodedTree, decode_tree, encode_tree
from skillstate.storage.lease import host_id, lease_ttl
from skillstate.storage.store import GENESIS, Store
from skillstate.util import canonical_json, hash_value, sha256_text


def _dataset(config: SkillConfig, env: type[SkillEnv],
             settings: BaseModel) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
    """The splits and the default skill of the run's environment."""
    from skillstate.envs.skill_evals import EvalsEnv

    wanted = [config.train_split, config.val_split, config.test_split]
    if config.backend == "sim" and not issubclass(env, (QAEnv, EpisodeEnv, ToolEnv, EvalsEnv)):
        raise ConfigError(f"env {config.env!r} is none of the kinds the sim backend plays (question answering, a "
                          "text world, tool use, a skill's evals): use --backend openai")
    if config.data:
        return env.load_splits(config.data, wanted), None
    if issubclass(env, EvalsEnv):
        return skill_evals(config, settings, wanted), None
    own = env.builtin_splits(settings, wanted)
    if own is not None:
        return own, None
    if not issubclass(env, QAEnv):
        raise DataError(f"env {config.env!r} has no built-in tasks: pass --data DIR (with train/val/test .jsonl)")
    if config.backend != "sim":
        raise DataError("backend openai needs a dataset: pass --data DIR (with train/val/test .jsonl)")
    from skillstate.sim.world import bundled_skill, bundled_splits

    generated = bundled_splits()
    for key, name in zip(("train_split", "val_split", "test_split"), wanted, strict=True):
        if name not in generated:
            raise ConfigError(f"{key} {name!r}: the bundled sim world has no such split (its splits: "
                              f"{', '.join(generated)}); pass --data DIR to use other split names")
    splits = {name: generated[name] for name in wanted}
    return splits, bundled_skill()


def skill_evals(config: SkillConfig, settings: BaseModel, wanted: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The evals of the skill directory a run starts from, split by the run's seed (`env_config.split`); with
    `disclosure: tools`, its trigger evals too, split the same way (by shares: counts size the evals)."""
    from skillstate.envs.skill_evals import stored_item, trigger_item
    from skillstate.evals import DEFAULT_SIZES, read_skill_evals, split_evals

    if not config.initial_skill:
        raise DataError(f"env {config.env!r} reads the evals of the skill it trains: set initial_skill to a skill "
                        "directory holding evals/evals.json, or pass --data DIR")
    evals = read_skill_evals(config.initial_skill)
    sizes = getattr(settings, "split", DEFAULT_SIZES)
    splits = split_evals(evals.items, config.seed, sizes, source=str(evals.path))
    out = {name: [stored_item(item) for item in part] for name, part in zip(wanted, splits.as_dict().values(),
                                                                            strict=True)}
    if config.disclosure == "tools" and evals.triggers:  # does the description make the agent use the skill?
        shares = DEFAULT_SIZES if all(isinstance(s, int) for s in sizes) else sizes
        items = [trigger_item(n, t.query, t.should_trigger) for n, t in enumerate(evals.triggers, 1)]
        parts = split_evals(items, config.seed, shares, key=lambda i: i["prompt"], source=str(evals.trigger_path))
        for name, part in zip(wanted, parts.as_dict().values(), strict=True):
            out[name] += part
    return out


def evals_env(config: SkillConfig) -> SkillConfig:
    """The config a run is created with: a run of the default env that names no data and starts from a skill
    directory holding evals/evals.json trains on those evals (env evals). Env evals gates on the soft score
    (the weighted share of checks passed) unless gate_metric is set: an output rarely passes every check of
    an eval, so the hard score alone would leave the gate nothing to compare for most of a run."""
    from skillstate.evals import has_evals

    if config.env == "qa" and not config.data and config.initial_skill:
        path = Path(config.initial_skill).expanduser()
        folder = path.parent if path.name == "SKILL.md" else path
        if folder.is_dir() and has_evals(folder):
            config = config.model_copy(update={"env": "evals"})
    if config.env == "evals" and "gate_metric" not in config.model_fields_set:
        config = config.model_copy(update={"gate_metric": "soft"})
    return config


def _imported_trajectories(path: str) -> str:
    """The trajectories file of `bank.trajectories` (the spec's format, or ETO's, converted), checked and as
    canonical JSON (the log keeps this)."""
    from skillstate.bank.eto_format import trajectories_from_text

    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read trajectories {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        return canonical_json([t.model_dump(mode="json") for t in trajectories_from_text(text)])
    except RecursionError:
        raise ConfigError(f"trajectories {path}: values nested too deeply to read") from None


def check_disclosure(config: SkillConfig) -> None:
    """What `disclosure: tools` needs of the rest of the config (at creation, and of a fork's)."""
    if config.disclosure != "tools":
        if config.distractor_skills:
            raise ConfigError("distractor_skills are installed beside the trained skill only with disclosure: tools")
        if config.train_files == "all":
            raise ConfigError("train_files: all needs disclosure: tools (inline, the target is shown SKILL.md alone, "
                              "so the other files could not change a score)")
        return
    if config.mode == "bank":
        raise ConfigError("disclosure: tools installs one Agent Skills skill; mode bank retrieves bank skills itself")
    if not config.protect_front_matter:
        raise ConfigError("disclosure: tools needs protect_front_matter: the name and description the target "
                          "chooses by change only through describe edits")


def trains_tree(config: SkillConfig, source: InitialSkill) -> bool:
    """Whether a run trains its skill directory's every file (`train_files`), not SKILL.md alone."""
    return source.encoded is not None and config.mode != "bank" and (
        config.train_files == "all" or (config.train_files == "auto" and config.disclosure == "tools"))


def _distractors(config: SkillConfig, source: InitialSkill, env_cls: type[SkillEnv],
                 splits: dict[str, list[dict[str, Any]]]) -> list[EncodedTree]:
    """The trees of `distractor_skills`, after checking that `disclosure: tools` can install the run's skills
    (and that each item's `expected_skill` names one of them, or is "" for none)."""
    check_disclosure(config)
    if config.disclosure != "tools":
        return []
    from skillstate.envs.disclosure import disclosure_problem

    problem = disclosure_problem(env_cls)
    if problem is not None:
        raise ConfigError(f"disclosure: tools {problem}, not env {config.env!r}: use disclosure: inline")
    if source.encoded is None or source.report is None:
        raise ConfigError("disclosure: tools installs an Agent Skills skill: initial_skill must be a skill "
                          "directory (or its SKILL.md, or a .skill/.zip archive) with a name and a description")
    keys = [k for k in (os.environ.get(m.api_key_env or "", "") for m in _role_configs(config)) if k]
    names: dict[str, str] = {str(source.report.name): str(config.initial_skill)}
    out = []
    for path in config.distractor_skills:
        if not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"distractor skill {path}: no such file or directory")
        if not is_skill_tree_path(path):
            raise ConfigError(f"distractor skill {path}: not an Agent Skills skill (a directory, its SKILL.md with "
                              "a front matter, or a .skill/.zip archive)")
        try:
            other = read_initial_skill(path, keys)
        except ConfigError as err:
            raise ConfigError(str(err).replace("initial skill", "distractor skill", 1)) from None
        assert other.encoded is not None and other.report is not None  # a tree path reads as a tree
        if other.report.name in names:
            raise ConfigError(f"distractor skill {path}: the name {other.report.name!r} is already installed "
                              f"(from {names[other.report.name]}); installed skills need distinct names")
        names[str(other.report.name)] = path
        out.append(other.encoded)
    for split, items in splits.items():
        bad = next((item for item in items if "expected_skill" in item
                    and item["expected_skill"] not in {*names, ""}), None)
        if bad is not None:
            raise DataError(f"item {bad['id']!r} of split {split!r}: expected_skill {bad['expected_skill']!r} is not "
                            f"an installed skill (installed: {', '.join(sorted(names))}; \"\" for none)")
    return out


def _role_configs(config: SkillConfig) -> list[Any]:
    """Every role's endpoint settings (the judge's as it reaches its model): whose keys a skill may not hold."""
    return [config.target, config.optimizer, config.role_config("judge")]


def _initial_skill(config: SkillConfig, default: str | None, env: SkillEnv) -> InitialSkill:
    if config.initial_skill:
        keys = [os.environ.get(model.api_key_env or "", "") for model in _role_configs(config)]
        return read_initial_skill(config.initial_skill, [k for k in keys if k])
    return InitialSkill(default if default is not None else env.default_skill())


# More steps than this is a mistake, not a plan (SkillOpt's own runs have tens).
MAX_TOTAL_STEPS = 100_000


def check_schedule(total_steps: int) -> None:
    if total_steps > MAX_TOTAL_STEPS:
        raise ConfigError(f"the schedule has {total_steps:,} steps, more than the {MAX_TOTAL_STEPS:,} allowed; "
                          "lower num_epochs or raise batch_size")


def preflight(config: SkillConfig, roles: tuple[str, ...] = ("target", "optimizer"), *,
              probe: bool = True, keys_only: bool = False) -> None:
    """Fail on missing models or credentials before anything is written; with
    `probe`, also ask each endpoint whether it answers and serves the model,
    so a bad key, a closed port or an unknown model leaves no run behind.
    Each role's client is built (which checks its base_url), except with
    `keys_only`: a caller that probes later (each client takes tens of
    milliseconds)."""
    from skillstate.engine.executors import check_executor

    lease_ttl(), host_id()  # the run's driver reads these first: a bad one must not leave a run behind
    check_executor(config, connect=probe and not keys_only)
    checked: set[tuple[Any, ...]] = set()
    for role in roles:
        model = config.model_for(role)
        if config.backend != "openai":
            continue
        from skillstate.llm.openai_backend import OpenAIBackend, api_key

        cfg = config.role_config(role)
        api_key(cfg, role)
        key = (cfg.base_url, cfg.api_key_env, cfg.azure, model)
        if keys_only or (probe and key in checked):
            continue
        backend = OpenAIBackend(cfg, role)
        if probe:
            checked.add(key)
            try:
                backend.check(model)
                # A run whose every call would fail, or whose tools would never run:
                if role == "target" and config.target.check_tools and (uses_tools(config.env)
                                                                       or config.disclosure == "tools"):
                    from skillstate.llm.endpoint_check import check_tools

                    check_tools(backend, model, config.env, disclosure=not uses_tools(config.env))
            except FatalLLMError as err:
                raise UserError(f"{err}; no run was created") from None


def uses_tools(env: str) -> bool:
    """Whether environment `env`'s target calls tools (OpenAI function calling)."""
    return issubclass(resolve_env(env), ToolEnv)


def create_run(store: Store, config: SkillConfig, run_id: str | None = None, *,
               eval_split: str | None = None, policy: PolicyStart | None = None, without_skill: bool = False) -> str:
    """Validate everything, then write the run row and RunStarted atomically.

    With `eval_split` the run is an evaluation run: it scores its initial
    skill on that split and has no steps. With `policy` it is a policy
    training run (kind policy): its skill is `policy.skill` (a run's best
    skill or bank), and `policy.events` follow RunStarted in the same
    transaction. With `without_skill` (an evaluation run) the target is
    shown no skill at all: what a skill adds is measured against that."""
    kind = "eval" if eval_split else "policy" if policy is not None else "train"
    run_id = run_id or new_run_id("eval" if eval_split else "run")
    if store.get_run(run_id) is not None:
        raise UserError(f"run {run_id!r} already exists")
    config = evals_env(config)
    preflight(config, roles_of(kind, config.env), keys_only=True)  # (the endpoints are probed last, below)
    env_cls = resolve_env(config.env)
    env_cls.check_requirements()
    settings = env_settings(env_cls, config.env_config, config.env)
    config = config.model_copy(update={"env_config": settings.model_dump(mode="json")})  # stored with defaults
    splits, default_skill = _dataset(config, env_cls, settings)
    splits = splits if eval_split else with_selection_split(config, splits, env_cls)  # final_selection
    if eval_split is not None and eval_split not in splits:
        raise ConfigError(f"unknown split {eval_split!r} (this run's splits: {', '.join(splits)})")
    if config.mode == "bank" and config.bank.embedder == "local":
        from skillstate.llm.embeddings import require_local_model

        require_local_model()
    if config.mode == "bank" and config.bank.embedder == "openai":
        from skillstate.llm.embeddings import OpenAIEmbeddings

        OpenAIEmbeddings(config.optimizer)  # its key and endpoint settings, before anything is written
    if without_skill:
        if not eval_split or config.mode == "bank":
            raise ConfigError("without a skill is an evaluation of the target alone (mode skill)")
        source = InitialSkill("")
        skill = source.text
    elif policy is not None:  # the skill a run ended with, as its log holds it
        if config.mode == "bank":
            from skillstate.bank.document import read_bank

            read_bank(policy.skill)
        source = InitialSkill(policy.skill)
        skill = source.text
    elif config.mode == "bank":  # the bank is the run's skill: an empty one, or a bank file
        from skillstate.bank.document import EMPTY_BANK, bank_text
        from skillstate.bank.skillrl_format import bank_from_text

        if config.initial_skill and is_skill_tree_path(config.initial_skill):
            raise ConfigError(f"initial skill {config.initial_skill}: mode bank starts from a bank file (JSON), "
                              "not an Agent Skills directory or archive")
        env = construct_env(env_cls, splits, settings, config.env) if config.initial_skill else None
        skill = bank_text(bank_from_text(_initial_skill(config, None, env).text) if env is not None else EMPTY_BANK)
        source = InitialSkill(skill)
    else:
        source = _initial_skill(config, default_skill, construct_env(env_cls, splits, settings, config.env))
        skill = source.text
    distractors = _distractors(config, source, env_cls, splits)
    prompts = resolve_prompts(config.prompts)
    blobs: dict[str, str] = {}

    def put(text: str) -> str:
        h = sha256_text(text)
        blobs[h] = text
        return h

    dataset = {name: {"hash": put(canonical_json(items)), "count": len(items)} for name, items in splits.items()}
    imported = put(_imported_trajectories(config.bank.trajectories)) if config.mode == "bank" and \
        config.bank.trajectories else None
    tree = source.encoded
    if trains_tree(config, source):  # the run's skill is the whole directory, kept a tree blob
        whole = encode_tree(decode_tree(tree.root, tree.blobs), as_tree=True)  # type: ignore[union-attr]
        blobs.update(whole.blobs)
        skill = whole.root
    if tree is not None:
        blobs.update(tree.blobs)
    for other in distractors:
        blobs.update(other.blobs)
    tree_blobs = sorted({h for t in ([tree] if tree is not None else []) + distractors for h in t.blobs}
                        - {t.root_hash for t in distractors} - ({tree.root_hash} if tree is not None else set()))
    spe = steps_per_epoch(len(splits[config.train_split]), config.batch_size, config.accumulation)
    if kind == "train":
        check_schedule(spe * config.num_epochs)
    else:  # an evaluation or a policy training has no SkillOpt steps
        spe = 0
    stored = public_config(config)
    validate_config(stored)  # the config as the log will hold it must read back (a resume reads it so)
    preflight(config, roles_of(kind, config.env))  # last: it may call the endpoints
    event = RunStarted(
        config=stored, initial_skill=put(skill), dataset=dataset,
        dataset_fingerprint=hash_value({k: v["hash"] for k, v in dataset.items()}),
        prompts={name: put(text) for name, text in prompts.items()},
        steps_per_epoch=spe, total_steps=spe * config.num_epochs,
        trajectories=imported,
        skill_tree=tree.root_hash if tree is not None else None,
        skill_tree_blobs=tree_blobs, distractors=[t.root_hash for t in distractors],
        package_version=__version__, kind=kind, eval_split=eval_split,
    )
    events: list[Event] = [event]
    if policy is not None:
        blobs.update(policy.blobs)
        events += policy.events
    store.append(run_id, events, last_seq=0, last_hash=GENESIS, blobs_to_put=blobs, new_run={"kind": kind})
    return run_id


@dataclass(frozen=True)
class PolicyStart:
    """What a policy training run starts from (see `create_run`)."""

    skill: str
    events: list[Event]
    blobs: dict[str, str]


# Keys a fork may not change: they define what the inherited state means (the episode keys decide what an
# inherited score measured; the analysts' window, episode.reflect_*, may change).
FIXED_ON_FORK = ("env", "env_config", "data", "train_split", "val_split", "test_split", "initial_skill", "mode",
                 "disclosure", "distractor_skills", "disclosure_max_calls", "train_files",
                 "final_selection.split", "final_selection.carve_from", "final_selection.size",
                 "bank.trajectories", "gate_length_penalty",
                 "episode.max_turns", "episode.max_invalid", "episode.history", "episode.max_observation_chars")


def _fixed_on_fork(key: str, value: Any) -> str | None:
    """The fixed key an override would change, if any."""
    if key in FIXED_ON_FORK or key.split(".")[0] in FIXED_ON_FORK:
        return key
    if isinstance(value, dict):  # a whole section: --set 'episode={"max_turns": 9}'
        return next((found for k, v in value.items() if (found := _fixed_on_fork(f"{key}.{k}", v))), None)
    return None


def fork_run(store: Store, parent_run_id: str, step: int, overrides: dict[str, Any],
             run_id: str | None = None, *, probe: bool = True) -> str:
    """A new run inheriting the parent's state after `step`, with overrides.
    Without `probe` the endpoints are not asked (a fork created offline, to
    be trained later)."""
    parent = lineage_events(store, parent_run_id)
    if parent and getattr(parent[0].event, "kind", "train") != "train":
        kind = getattr(parent[0].event, "kind", "train")
        what = {"eval": "an evaluation run", "policy": "a policy training"}.get(kind, "not a training run")
        hint = "; train a new policy from its source run" if kind == "policy" else ""
        raise UserError(f"run {parent_run_id!r} is {what}; only training runs can be forked{hint}")
    count = step_boundary(parent, step)
    checked_prefix(store, parent_run_id, parent[:count])  # nothing is built on a damaged log or blob
    state = state_of(parent[:count])
    for key, value in overrides.items():
        fixed = _fixed_on_fork(key, value)
        if fixed is not None:
            raise ConfigError(f"a fork cannot change {fixed}: it inherits the parent's data, starting skill and the "
                              "episode settings its scores were measured with")
    config = validate_config(merge_overrides(dict(state.config), overrides))
    check_fork_selection(config, state.dataset)
    check_disclosure(config)
    prompts = dict(state.prompts)
    blobs: dict[str, str] = {}
    inherited = dict(state.config.get("prompts", {}))
    # overridden prompts, and prompts this skillstate has that the parent's version did not
    changed = {k: v for k, v in config.prompts.items() if inherited.get(k) != v}
    missing = [name for name in PROMPT_NAMES if name not in prompts and name not in changed]
    if changed or missing:
        texts = resolve_prompts(changed)
        for name in [*changed, *missing]:
            h = sha256_text(texts[name])
            prompts[name], blobs[h] = h, texts[name]
    spe = steps_per_epoch(state.dataset[config.train_split]["count"], config.batch_size, config.accumulation)
    total = spe * config.num_epochs
    if total < step:
        raise ConfigError(f"the fork's schedule has {total} steps, fewer than the fork step {step}")
    check_schedule(total)
    stored = public_config(config)
    validate_config(stored)  # the config as the log will hold it must read back
    run_id = run_id or new_run_id("fork")
    if store.get_run(run_id) is not None:
        raise UserError(f"run {run_id!r} already exists")
    preflight(config, probe=probe)
    event = RunForked(parent_run_id=parent_run_id, fork_step=step, parent_event_count=count,
                      parent_event_hash=parent[count - 1].hash,
                      overrides={k: redact(v) if isinstance(v, str) else v for k, v in overrides.items()},
                      config=stored, prompts=prompts, steps_per_epoch=spe, total_steps=total)
    store.append(run_id, [event], last_seq=0, last_hash=parent[count - 1].hash, blobs_to_put=blobs,
                 new_run={"parent_run_id": parent_run_id, "fork_step": step})
    return run_id

"""Progressive disclosure: the target sees installed skills the way agents show them.

With `disclosure: tools`, a rollout does not put the skill in the system prompt.
The system prompt lists each installed skill by name and description (the
trained one and any `distractor_skills`, in name order, so the list does not
say which one is trained). The target loads a skill's `SKILL.md` with
`load_skill(name)` and opens a file of it with `read_skill_file(skill, path)`,
then answers; the environment it wraps (question answering) scores the answer.
The trajectory records which skills and files the target loaded.

The trained skill's `SKILL.md` is the run's current skill text, its other files
fixed and read from the run's log; or, in a run that trains the whole directory
(`train_files`), every file comes from the current skill. The distractors are
fixed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome, SkillEnv
from skillstate.envs.episode_loop import clip
from skillstate.envs.qa import QAEnv
from skillstate.envs.tools import take_reply
from skillstate.errors import ConfigError
from skillstate.llm.base import CallResult
from skillstate.prompts import render
from skillstate.skilltree import SKILL_MD, SkillTree, skill_md_path
from skillstate.skilltree.bundle import is_bundle, unbundle
from skillstate.skilltree.frontmatter import front_matter_or_none

LOAD_SKILL = "load_skill"
READ_FILE = "read_skill_file"
FILES_LINE = "Files in this skill:"  # the line after a loaded SKILL.md that lists the skill's other files
MAX_TOOL_OUTPUT = 20_000  # characters of a file the target is given at once
SHOWN_OUTPUT = 1_500  # characters of a tool's output the analysts see
MAX_ARGUMENTS = 10_000  # characters of a tool call's arguments read
MAX_ROLLOUT_OUTPUT = 100_000  # characters of tool output one rollout is given in all

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": LOAD_SKILL,
        "description": "Load an installed skill: returns its SKILL.md instructions and the files it holds.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string", "description": "The skill's name"}},
                       "required": ["name"]}}},
    {"type": "function", "function": {
        "name": READ_FILE,
        "description": "Read a file of an installed skill (a reference or script its SKILL.md points to).",
        "parameters": {"type": "object", "properties": {
            "skill": {"type": "string", "description": "The skill's name"},
            "path": {"type": "string", "description": "The file's path inside the skill, e.g. references/x.md"}},
            "required": ["skill", "path"]}}},
]


@dataclass(frozen=True)
class InstalledSkill:
    """One installed skill as the target can see it: its name, its description,
    and its files (path -> text; None for a binary file, which it cannot read)."""

    name: str
    description: str
    files: Mapping[str, str | None]

    @property
    def skill_md(self) -> str:
        return self.files.get(SKILL_MD) or ""


def installed_skill(tree: SkillTree, skill_md: str | None = None) -> InstalledSkill:
    """A skill tree as installed, its SKILL.md replaced by `skill_md` when given
    (the trained text; a name or description it lacks is kept from the tree's)."""
    md_path = skill_md_path(tree)
    files: dict[str, str | None] = {p: (None if f.is_binary else f.text) for p, f in tree.items() if p != md_path}
    original = front_matter_or_none(tree[md_path].text)
    text = skill_md if skill_md is not None else tree[md_path].text
    files[SKILL_MD] = text
    front = front_matter_or_none(text)  # unreadable: the name and description as the tree had them
    fields = {**(original.fields if original else {}), **(front.fields if front else {})}
    return InstalledSkill(str(fields.get("name", "")), str(fields.get("description", "")).strip(), files)


@dataclass(frozen=True)
class Installation:
    """What a run installs: the trained skill's tree (its SKILL.md replaced each
    rollout by the current text) and the fixed distractor skills."""

    trained: SkillTree
    distractors: Sequence[InstalledSkill] = ()

    def trained_skill(self, skill: str) -> InstalledSkill:
        """The trained skill as installed for a rollout of the run's skill text: its SKILL.md, or (a run that
        trains the whole directory) the bundle of every file (`skilltree.bundle`)."""
        if is_bundle(skill):
            return installed_skill(unbundle(skill))
        return installed_skill(self.trained, skill)

    def skills(self, skill: str) -> list[InstalledSkill]:
        """Every installed skill with the trained one as `trained_skill` gives it, in name order."""
        return sorted([self.trained_skill(skill), *self.distractors], key=lambda s: s.name)


def catalogue(skills: Sequence[InstalledSkill]) -> str:
    """The installed skills as the system prompt lists them."""
    rows = [f"<skill>\n<name>{s.name}</name>\n<description>{s.description}</description>\n</skill>" for s in skills]
    return "<available_skills>\n" + "\n".join(rows) + "\n</available_skills>"


def _body(skill: InstalledSkill) -> str:
    others = sorted(p for p in skill.files if p != SKILL_MD)
    listing = f"\n\n{FILES_LINE} {', '.join(others)}" if others else ""
    return f"Skill {skill.name!r} loaded.\n\n{skill.skill_md}{listing}"


def run_tool(skills: Sequence[InstalledSkill], name: str, arguments: str) -> tuple[str, str | None, str | None]:
    """(output, skill loaded, file read as "skill/path") of one tool call."""
    if len(arguments or "") > MAX_ARGUMENTS:
        return f"error: the arguments are over {MAX_ARGUMENTS} characters", None, None
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as err:
        return f"error: the arguments are not valid JSON ({err.msg})", None, None
    except (ValueError, RecursionError):  # nested too deep, or a number too long to read
        return "error: the arguments are not JSON this tool can read", None, None
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object", None, None
    by_name = {s.name: s for s in skills}
    wanted = str(args.get("name" if name == LOAD_SKILL else "skill", "")).strip()
    if name not in (LOAD_SKILL, READ_FILE):
        return f"error: there is no tool {name!r} (tools: {LOAD_SKILL}, {READ_FILE})", None, None
    if wanted not in by_name:
        return f"error: no skill named {wanted!r} is installed (installed: {', '.join(sorted(by_name))})", None, None
    skill = by_name[wanted]
    if name == LOAD_SKILL:
        return clip(_body(skill), MAX_TOOL_OUTPUT), skill.name, None
    path = str(args.get("path", "")).strip().removeprefix("./")
    if path == SKILL_MD:  # reading SKILL.md is loading the skill
        return clip(_body(skill), MAX_TOOL_OUTPUT), skill.name, None
    if path not in skill.files:
        return f"error: skill {wanted!r} has no file {path!r} (files: {', '.join(sorted(skill.files))})", None, None
    text = skill.files[path]
    if text is None:
        return f"error: {path} is a binary file; it cannot be read as text", None, None
    return clip(text, MAX_TOOL_OUTPUT), None, f"{skill.name}/{path}"


class SkillReader:
    """The installed skills as one rollout's tools give them: the catalogue for the system prompt, and the
    replies of `load_skill` and `read_skill_file`, each skill or file given once (then "already loaded
    above") and at most MAX_ROLLOUT_OUTPUT characters in all. `loaded` and `read` record what it gave."""

    def __init__(self, installation: Installation, skill: str):
        self.trained = installation.trained_skill(skill)
        self.skills = sorted([self.trained, *installation.distractors], key=lambda s: s.name)
        self.loaded: list[str] = []
        self.read: list[str] = []
        self.given = 0

    def system_prompt(self, prompts: dict[str, str]) -> str:
        return render(prompts["disclosure_system"], catalogue=catalogue(self.skills)).strip()

    @staticmethod
    def serves(name: str) -> bool:
        return name in (LOAD_SKILL, READ_FILE)

    def run(self, name: str, arguments: str) -> str:
        output, skill_loaded, file_read = run_tool(self.skills, name, arguments)
        if skill_loaded in self.loaded or file_read in self.read:  # once is enough: the text is above
            output = f"{skill_loaded or file_read} is already loaded above."
        elif self.given + len(output) > MAX_ROLLOUT_OUTPUT:
            output = (f"error: this task has been given {self.given} characters of skill files, the most it may "
                      "be; answer with what you have")
        self.given += len(output)
        if skill_loaded and skill_loaded not in self.loaded and not output.startswith("error:"):
            self.loaded.append(skill_loaded)
        if file_read and file_read not in self.read and not output.startswith("error:"):
            self.read.append(file_read)
        return output

    def installed(self) -> list[dict[str, str]]:
        return [{"name": s.name, "description": s.description} for s in self.skills]


def disclosure_problem(env_cls: type) -> str | None:
    """Why progressive disclosure cannot play environments of `env_cls` (None when it can): it plays question
    answering, with QAEnv's own single-call rollout (it supplies the rollout; a subclass may score differently)."""
    if getattr(env_cls, "plays_disclosure", False):  # an environment whose own loop offers the skill tools
        return None
    if not issubclass(env_cls, QAEnv):
        return "plays question-answering environments and workspace tasks"
    if env_cls.rollout is not QAEnv.rollout:
        return "plays question answering with QAEnv's own rollout (this environment has its own)"
    return None


def disclosed(env: SkillEnv, installation: Installation, max_calls: int) -> SkillEnv:
    """`env` played with progressive disclosure over `installation`."""
    problem = disclosure_problem(type(env))
    if problem is None and getattr(type(env), "plays_disclosure", False):
        env.installation = installation  # type: ignore[attr-defined]
        env.max_calls = max_calls  # type: ignore[attr-defined]
        return env
    if problem is not None or not isinstance(env, QAEnv):
        raise ConfigError(f"disclosure: tools {problem}, not env {env.kind!r}")
    return DisclosureEnv(env, installation, max_calls)


def answer_with_skills(reader: SkillReader, messages: list[dict[str, Any]], complete: Complete,
                       max_calls: int) -> tuple[str | None, str, list[CallResult]]:
    """The target's answer to `messages` (a system prompt listing the installed skills, and the task), its
    `load_skill` and `read_skill_file` calls served by `reader` (which records what it loaded and read) on the
    way: (the answer, or None with the reason there is none; every call made). `messages` grows with the
    conversation."""
    calls: list[CallResult] = []
    for _ in range(max_calls):
        result = complete(messages, tools=TOOLS)
        calls.append(result)
        answer, failed = take_reply(result, messages)
        if failed or answer is not None:
            return answer, failed or "", calls
        for call in result.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": reader.run(call.name,
                                                                                            call.arguments)})
    return None, f"max_calls: no answer within {max_calls} calls (disclosure_max_calls)", calls


def installation_of_env(env: SkillEnv) -> Installation | None:
    """The skills a disclosure environment installs (None for any other environment)."""
    if isinstance(env, DisclosureEnv):
        return env.installation
    return getattr(env, "installation", None) if getattr(type(env), "plays_disclosure", False) else None


class DisclosureEnv(SkillEnv):
    """A question-answering environment played with progressive disclosure.
    Everything but the rollout and the analysts' view is the wrapped one's."""

    kind = "disclosure"

    def __init__(self, inner: QAEnv, installation: Installation, max_calls: int = 8):
        super().__init__(inner.splits, inner.config)
        self.inner = inner
        self.installation = installation
        self.max_calls = max_calls
        self.kind = inner.kind

    def __getattr__(self, name: str) -> Any:  # settings and helpers of the wrapped environment
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def default_skill(self) -> str:
        return self.inner.default_skill()

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        return self.inner.describe_item(item)

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        reader = SkillReader(self.installation, skill)
        messages: list[dict[str, Any]] = [{"role": "system", "content": reader.system_prompt(prompts)},
                                          {"role": "user", "content": self.inner.user_message(item, prompts)}]
        answer, reason, calls = answer_with_skills(reader, messages, complete, self.max_calls)
        loaded, read = reader.loaded, reader.read
        task_type = item.get("task_type", "")
        hard, soft = 0.0, 0.0
        if answer is not None:
            hard, soft, reason = self.inner.score(answer, item)
            if calls[-1].truncated and reason:
                reason += " (reply truncated at max_tokens)"
        trajectory = {"kind": "disclosure", "item_id": item["id"], "trained": reader.trained.name,
                      "installed": reader.installed(),
                      "skills_loaded": loaded, "files_read": read, "answer": answer, "messages": messages}
        return RolloutOutcome(hard=hard, soft=soft, fail_reason=reason, prediction=answer or "", task_type=task_type,
                              calls=calls, trajectory=trajectory, turns=len(calls),
                              skills_loaded=loaded, files_read=read)

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        """The task and answer, which skills the target loaded and which files it read, and the conversation
        without the system prompt (tool outputs clipped)."""
        if not isinstance(trajectory, dict) or trajectory.get("kind") != "disclosure":
            return self.inner.reflection_view(trajectory)
        convo = []
        for m in trajectory.get("messages", []):
            if m.get("role") == "system":
                continue
            shown = dict(m)
            if m.get("role") == "tool":
                shown["content"] = clip(str(m.get("content") or ""), SHOWN_OUTPUT)
            convo.append(shown)
        return {"installed_skills": trajectory.get("installed", []),
                "skills_loaded": trajectory.get("skills_loaded", []),
                "files_read": trajectory.get("files_read", []), "conversation": convo}

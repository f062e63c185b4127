"""Multi-turn environments: the agent acts in a world over many turns.

Two kinds sit beside the single-turn `SkillEnv`:
- `EpisodeEnv`, a text world: `open(item, seed)` starts an episode and
  returns a `Session`; the target, whose system prompt is the skill, is shown
  the task, its earlier actions, a window of recent turns and the latest
  observation, and replies with one action; `Session.step(action)` plays it.
- `ToolEnv` (in `skillstate.envs.tools`), an agent working through
  OpenAI-style function calls.

The engine's loop for both lives in `skillstate.envs.episode_loop`; an
environment only says how its world behaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome, SkillEnv


@dataclass(frozen=True)
class EpisodeSettings:
    """How episodes run and how they are shown (the config's `episode` section)."""

    max_turns: int = 50  # actions per episode
    max_invalid: int = 5  # this many invalid actions in a row end the episode
    history: int = 6  # recent turns shown in full to the target each turn (all its actions are always listed)
    max_observation_chars: int = 2000  # longer observations are cut in the target's prompt (never in the blob)
    reflect_last: int = 6  # turns at the end of a trajectory the analysts see
    reflect_score_changes: bool = True  # plus every turn where the score changed
    reflect_max_turns: int = 16  # at most this many turns in one analyst view
    seed: int = 0  # the run's seed, from which each episode's seed is derived
    workers: int = 8  # the run's concurrency: at most this many episodes run at once (bounds a process pool)


@dataclass(frozen=True)
class Turn:
    """What one action did. `score` is the environment's normalized score in
    [0, 1] after the action (None when it has none); `invalid` marks an action
    the environment did not understand or could not carry out."""

    action: str
    observation: str
    reward: float = 0.0
    score: float | None = None
    done: bool = False
    success: bool = False
    invalid: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Session:
    """One episode in progress. Subclasses set `goal` and `observation` when
    created and implement `step`; `close` gives back what the episode holds
    (a pooled process, say)."""

    goal: str = ""
    observation: str = ""  # the observation the episode starts with
    seed: int | None = None  # what the environment was reset with, recorded in the trajectory

    def step(self, action: str) -> Turn:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EpisodeEnv(SkillEnv):
    """A text world. Subclasses implement `open` (and `default_skill`); they
    may override `parse_action`, `reference_actions` and `task_type`.

    `settings` is filled in from the run's config before the first rollout.
    """

    kind = "episode"
    settings: EpisodeSettings = EpisodeSettings()

    def open(self, item: dict[str, Any], seed: int) -> Session:
        """Start the episode of `item`. `seed` is derived from the run's seed
        and the item; an environment whose items carry their own seed may use
        that instead (and sets `Session.seed` to what it used)."""
        raise NotImplementedError

    def parse_action(self, reply: str) -> str:
        """The action in the target's reply: the text after a last `Action:`,
        else the first non-empty line, stripped of quotes and a leading `>`."""
        text = reply.strip()
        low = text.lower()
        at = low.rfind("action:")
        if at >= 0:
            text = text[at + len("action:"):]
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        return line.lstrip(">").strip().strip("`'\"").strip()

    def reference_actions(self, item: dict[str, Any]) -> tuple[str, str, list[str]] | None:
        """(goal, first observation, a known good action sequence) of an item,
        when the world has one. The sim backend's agent plays from it and the
        interface tests check it solves the task; None when there is none."""
        return None

    def reference_session(self, item: dict[str, Any]) -> Session:
        """An episode of `item` for the sim agent to replay a reference path
        in. An environment whose episodes hold pooled processes returns one
        that does not draw on the episodes' pool (the sim agent asks while
        its own episode holds a process)."""
        return self.open(item, self.episode_seed(item, self.settings.seed))

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        from skillstate.envs.episode_loop import run_episode

        return run_episode(self, skill, item, complete, prompts)

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        from skillstate.envs.episode_loop import episode_view

        return episode_view(trajectory, self.settings)

    def episode_seed(self, item: dict[str, Any], run_seed: int) -> int:
        from skillstate.util import unit_float

        return int(unit_float("episode-seed", f"{run_seed}:{item['id']}") * 2**31)

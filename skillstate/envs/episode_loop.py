"""Playing one episode of a text world with the target as the agent, and
choosing which turns of a long trajectory the analysts see.

Each turn is one target call: the system prompt is the skill; the user
message (prompt `episode_user`) holds the task, the starting observation,
every action taken so far, the last `history` turns in full and the current
observation. The trajectory blob keeps every turn whole: the action, the
observation, reward and score, the target's raw reply and the hash of the
request in the call table (which holds the exact messages sent).
"""

from __future__ import annotations

import math
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome, score_problem
from skillstate.envs.episode import EpisodeEnv, EpisodeSettings, Turn
from skillstate.llm.base import CallResult
from skillstate.prompts import render


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


def episode_prompt(template: str, goal: str, first: str, turns: list[dict[str, Any]], observation: str,
                   settings: EpisodeSettings) -> str:
    recent = turns[-settings.history:] if settings.history > 0 else []
    lines = [f"> {t['action']}\n{clip(t['observation'], settings.max_observation_chars).strip()}" for t in recent]
    block = ("\nRecent turns:\n" + "\n".join(lines) + "\n") if lines else ""
    actions = " | ".join(t["action"] or "(none)" for t in turns) or "none yet"
    return render(template, goal=goal.strip(), first_observation=clip(first, settings.max_observation_chars).strip(),
                  count=len(turns), actions=actions, recent_block=block,
                  observation=clip(observation, settings.max_observation_chars).strip()).strip() + "\n"


def check_turn(n: int, turn: Any) -> None:
    """A Turn as documented (score None or a finite number in [0, 1], a
    finite reward, text observation), else a ValueError naming the turn and
    the field (the rollout then fails as the environment's error)."""
    if not isinstance(turn, Turn):
        raise ValueError(f"Session.step returned {type(turn).__name__}, not a Turn (turn {n})")
    problem = None if turn.score is None else score_problem(turn.score)
    if problem:
        raise ValueError(f"turn {n}: Turn.score {problem}")
    reward = turn.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"turn {n}: Turn.reward is {reward!r}, not a finite number")
    for name in ("action", "observation"):
        if not isinstance(getattr(turn, name), str):
            raise ValueError(f"turn {n}: Turn.{name} is {type(getattr(turn, name)).__name__}, not a str")


def _turn_record(n: int, turn: Turn, result: CallResult) -> dict[str, Any]:
    return {"turn": n, "action": turn.action, "observation": turn.observation, "reward": turn.reward,
            "score": turn.score, "done": turn.done, "invalid": turn.invalid, "reply": result.text,
            "request": result.ref.request_hash}


def run_episode(env: EpisodeEnv, skill: str, item: dict[str, Any], complete: Complete,
                prompts: dict[str, str]) -> RolloutOutcome:
    s = env.settings
    task_type = item.get("task_type", "")
    session = env.open(item, env.episode_seed(item, s.seed))
    turns: list[dict[str, Any]] = []
    calls: list[CallResult] = []
    observation, score, success, reason, invalid_run = session.observation, 0.0, False, "", 0
    try:
        for n in range(1, s.max_turns + 1):
            user = episode_prompt(prompts["episode_user"], session.goal, session.observation, turns, observation, s)
            result = complete([{"role": "system", "content": skill}, {"role": "user", "content": user}])
            calls.append(result)
            if not result.ok:
                reason = f"rollout_error: {result.error}"
                break
            action = env.parse_action(result.text)
            turn = session.step(action) if action else Turn(
                action="", observation="(no action: the reply held no action)", invalid=True)
            check_turn(n, turn)
            turns.append(_turn_record(n, turn, result))
            observation = turn.observation
            if turn.score is not None:
                score = turn.score
            invalid_run = invalid_run + 1 if turn.invalid else 0
            if turn.done:
                success = turn.success
                if not success:
                    reason = f"episode_lost: the world ended the episode at turn {n}: {clip(observation, 200)!r}"
                break
            if invalid_run >= s.max_invalid:
                reason = (f"invalid_actions: {invalid_run} invalid actions in a row, the last {action!r} "
                          f"({clip(observation, 120)!r})")
                break
        else:
            reason = f"max_turns: not solved within {s.max_turns} turns (score {score:.2f})"
    finally:
        session.close()
    if success:
        score, reason = 1.0, ""
    if calls and calls[-1].truncated and reason:
        reason += " (last reply truncated at max_tokens)"
    trajectory = {"kind": "episode", "item_id": item["id"], "seed": session.seed, "goal": session.goal,
                  "first_observation": session.observation, "success": success, "score": score,
                  "fail_reason": reason, "turns": turns}
    return RolloutOutcome(hard=1.0 if success else 0.0, soft=score, fail_reason=reason,
                          prediction=turns[-1]["action"] if turns else "", task_type=task_type, calls=calls,
                          trajectory=trajectory, turns=len(turns), seed=session.seed)


def window(turns: list[dict[str, Any]], settings: EpisodeSettings) -> list[int]:
    """Indexes of the turns an analyst sees: the last `reflect_last`, plus
    (with `reflect_score_changes`) every turn where the score changed, the
    most recent first when there are more than `reflect_max_turns`."""
    n = len(turns)
    chosen = set(range(max(0, n - settings.reflect_last), n))
    if settings.reflect_score_changes:
        before = 0.0
        for i, t in enumerate(turns):
            score = t.get("score")
            if score is not None and score != before:
                chosen.add(i)
                before = score
    return sorted(chosen)[-settings.reflect_max_turns:] if settings.reflect_max_turns > 0 else sorted(chosen)


def episode_view(trajectory: dict[str, Any], settings: EpisodeSettings) -> dict[str, Any]:
    """What the analysts see of one episode: the goal, the outcome and a
    window of turns; `shown_turns` records which (1-based), of how many."""
    turns = trajectory.get("turns", [])
    picked = window(turns, settings)
    shown = [{"turn": turns[i]["turn"], "action": turns[i]["action"],
              "observation": clip(turns[i]["observation"], settings.max_observation_chars),
              **({"score": turns[i]["score"]} if turns[i].get("score") is not None else {}),
              **({"invalid": True} if turns[i].get("invalid") else {}),
              **({"reply": clip(turns[i]["reply"], 400)} if turns[i].get("reply", "").strip() != turns[i]["action"]
                 else {})}
             for i in picked]
    return {"goal": trajectory.get("goal", ""), "outcome": "success" if trajectory.get("success") else "failure",
            "final_score": trajectory.get("score", 0.0), "total_turns": len(turns),
            "shown_turns": [turns[i]["turn"] for i in picked], "turns": shown}

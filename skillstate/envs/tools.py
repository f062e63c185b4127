"""Tool-using agents: the target answers a task by calling JSON-schema
functions (OpenAI function calling) that the environment executes.

The target is called with `tools=[...]`; each `tool_calls` entry of its
reply is run by `call_tool` and the result goes back as a `tool` message,
until the target answers in text or `episode.max_turns` calls have been
made. The trajectory blob holds the whole conversation, tool calls and
results included; the analysts see the task, the answer and a window of the
tool calls.
"""

from __future__ import annotations

import json
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome, SkillEnv
from skillstate.envs.episode import EpisodeSettings
from skillstate.envs.episode_loop import clip
from skillstate.llm.base import CallResult


def take_reply(result: CallResult, messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """One reply of a tool loop, added to the conversation: (its text, None) when the target answered; (None,
    the failure reason) when the call failed (the loop ends either way); (None, None) when it called tools, which
    the caller runs next."""
    if not result.ok:
        return None, f"rollout_error: {result.error}"
    if not result.tool_calls:
        messages.append({"role": "assistant", "content": result.text})
        return result.text, None
    messages.append({"role": "assistant", "content": result.text,
                     "tool_calls": [c.to_message() for c in result.tool_calls]})
    return None, None


class ToolError(Exception):
    """A tool call the environment refuses (bad arguments, say): its message
    goes back to the target as the tool's output."""


class ToolEnv(SkillEnv):
    """Subclasses implement `tools`, `call_tool`, `task_message`, `score` and
    `default_skill`. `settings` is filled in from the run's config."""

    kind = "tools"
    settings: EpisodeSettings = EpisodeSettings()

    def tools(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """The functions the target may call, in the OpenAI `tools` format:
        [{"type": "function", "function": {"name", "description", "parameters"}}]."""
        raise NotImplementedError

    def call_tool(self, item: dict[str, Any], name: str, arguments: dict[str, Any]) -> str:
        """Run one call; raise ToolError for a call that cannot run."""
        raise NotImplementedError

    def task_message(self, item: dict[str, Any]) -> str:
        raise NotImplementedError

    def score(self, answer: str, item: dict[str, Any]) -> tuple[float, float, str]:
        """(hard, soft, fail_reason) of the final answer."""
        raise NotImplementedError

    def reference_calls(self, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        """Tool calls (name, arguments) that answer the item, when known: the
        sim backend's agent makes them, and tests check they do answer it."""
        return None

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        s = self.settings
        tools = self.tools(item)
        names = {t["function"]["name"] for t in tools}
        messages: list[dict[str, Any]] = [{"role": "system", "content": skill},
                                          {"role": "user", "content": self.task_message(item)}]
        calls: list[CallResult] = []
        steps: list[dict[str, Any]] = []
        answer, reason, invalid_run = None, "", 0
        for n in range(1, s.max_turns + 1):
            result = complete(messages, tools=tools)
            calls.append(result)
            answer, failed = take_reply(result, messages)
            if failed or answer is not None:
                reason = failed or reason
                break
            for call in result.tool_calls:
                output, invalid = self._run(item, names, call.name, call.arguments)
                invalid_run = invalid_run + 1 if invalid else 0
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                steps.append({"turn": n, "tool": call.name, "arguments": call.arguments, "output": output,
                              "invalid": invalid, "request": result.ref.request_hash})
            if invalid_run >= s.max_invalid:
                reason = f"invalid_actions: {invalid_run} failed tool calls in a row, the last: {clip(output, 160)!r}"
                break
        else:
            reason = f"max_turns: no final answer within {s.max_turns} calls"
        task_type = item.get("task_type", "")
        if answer is None:
            hard, soft = 0.0, 0.0
        else:
            hard, soft, reason = self.score(answer, item)
            if calls[-1].truncated and reason:
                reason += " (reply truncated at max_tokens)"
        trajectory = {"kind": "tools", "item_id": item["id"], "task": self.task_message(item), "answer": answer,
                      "success": hard >= 1.0, "fail_reason": reason, "steps": steps, "messages": messages}
        return RolloutOutcome(hard=hard, soft=soft, fail_reason=reason, prediction=answer or "", task_type=task_type,
                              calls=calls, trajectory=trajectory, turns=len(calls))

    def _run(self, item: dict[str, Any], names: set[str], name: str, arguments: str) -> tuple[str, bool]:
        """(output, invalid) of one call."""
        if name not in names:
            return f"error: there is no tool {name!r} (tools: {', '.join(sorted(names))})", True
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as err:
            return f"error: the arguments are not valid JSON ({err.msg})", True
        except (ValueError, RecursionError):  # nested too deep, or a number too long to read
            return "error: the arguments are not JSON this tool can read", True
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object", True
        try:
            return self.call_tool(item, name, args), False
        except ToolError as err:
            return f"error: {err}", True

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        s = self.settings
        steps = trajectory.get("steps", [])
        shown = steps[-s.reflect_max_turns:] if s.reflect_max_turns > 0 else steps
        return {"task": trajectory.get("task", ""), "answer": trajectory.get("answer"),
                "outcome": "success" if trajectory.get("success") else "failure", "total_tool_calls": len(steps),
                "shown_tool_calls": len(shown),
                "tool_calls": [{"tool": c["tool"], "arguments": c["arguments"],
                                "output": clip(c["output"], s.max_observation_chars)} for c in shown]}

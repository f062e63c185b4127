"""Screening edits before selection: the budget goes only to edits that
change something; dropped edits are recorded with their reasons, and a step
left with nothing is a skip with no gate calls."""

from __future__ import annotations

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.log.events import Edit
from skillstate.skillopt.editor import CHANGED, apply_edit
from skillstate.skillopt.screen import normalize_line, screen_edits

SKILL = "# Skill\n\n## Rules\n- Always show your work.\n- Use   SI units.\n"


def _reasons(body: str, edits: list[Edit], block: str = "") -> dict[int, str]:
    _, dropped = screen_edits(body, block, edits)
    return {d.index: d.reason for d in dropped}


def test_each_kind_of_no_op_is_dropped_with_its_reason():
    edits = [
        Edit(op="append", content="- always show   YOUR work."),  # held, after normalizing case and spaces
        Edit(op="insert_after", target="## Rules", content="* Use SI units."),  # another list marker
        Edit(op="replace", target="- Never guess.", content="- Guess less."),  # target absent
        Edit(op="delete", target=""),  # empty target
        Edit(op="replace", target="- Use   SI units.", content="- Use   SI units."),  # no change
        Edit(op="append", content="- Check the units."),  # kept
        Edit(op="append", content="- check the units."),  # the same edit again
        Edit(op="frobnicate", content="x"),
        Edit(op="delete", target="- Keep the guidance."),  # only in the protected block
        Edit(op="append", content="   "),
    ]
    assert _reasons(SKILL, edits, block="- Keep the guidance.\n") == {
        0: "already_in_skill", 1: "already_in_skill", 2: "target_absent", 3: "empty_target", 4: "no_change",
        6: "duplicate", 7: "unknown_op", 8: "protected_block", 9: "empty_content"}


def test_a_suggestion_the_skill_already_follows_is_not_a_suggestion():
    edits = [Edit(op="suggest", content="Use SI units."), Edit(op="suggest", content="show your work"),
             Edit(op="suggest", content="Prefer metric prefixes.")]
    assert _reasons(SKILL, edits) == {0: "already_in_skill", 1: "already_in_skill"}


lines = st.lists(st.sampled_from(["- Be brief.", "- Use SI units.", "## Rules", "- Check twice.", "Note: x",
                                  "- be   BRIEF.", ""]), max_size=8)
edit = st.builds(Edit, op=st.sampled_from(["append", "insert_after", "replace", "delete", "bogus"]),
                 target=st.sampled_from(["", "## Rules", "- Be brief.", "- Check twice.", "absent"]),
                 content=st.sampled_from(["", "- Be brief.", "- New rule.", "- Use SI units.", "- check TWICE."]))


@examples(full=300, sampled=60)
def test_screening_keeps_exactly_the_edits_that_would_change_something(max_examples):
    @given(lines, st.lists(edit, max_size=10))
    @settings(max_examples=max_examples, deadline=None)
    def check(skill_lines, edits):
        body = "\n".join(skill_lines) + "\n"
        kept, dropped = screen_edits(body, "", edits)
        assert sorted(kept + [d.index for d in dropped]) == list(range(len(edits)))
        held = {normalize_line(line) for line in body.splitlines() if normalize_line(line)}
        for i in kept:  # a kept edit, applied alone, changes the text and adds something the skill lacks
            e = edits[i]
            _, status = apply_edit(body, e)
            assert status in CHANGED
            if e.op in ("append", "insert_after"):
                assert any(normalize_line(line) not in held for line in e.content.splitlines() if line.strip())
        for d in dropped:
            e = edits[d.index]
            if d.reason == "duplicate":
                assert any(edits[j].op == e.op for j in kept if j < d.index)
            elif d.reason in ("target_absent", "empty_target", "no_change", "unknown_op", "empty_content"):
                assert apply_edit(body, e)[0] == body or d.reason == "no_change"
            else:
                assert d.reason == "already_in_skill"
                assert all(normalize_line(line) in held for line in e.content.splitlines() if line.strip())

    check()


def test_a_step_whose_edits_all_change_nothing_is_a_skip_without_gate_calls(tmp_path):
    from conftest import scripted_factory, small_config

    from skillstate.engine.runner import lineage_events
    from skillstate.trainer import Trainer

    def optimizer(prompt: str) -> str:  # every analyst proposes a rule the skill already has
        if "selected_indices" in prompt:
            return '{"selected_indices": [0]}'
        return '{"reasoning": "r", "edits": [{"op": "append", "target": "", "content": "- Always answer with ' \
               'a single word."}]}'

    result = Trainer(small_config(num_epochs=1), db=f"sqlite:///{tmp_path / 's.db'}", run_id="s",
                     backend_factory=scripted_factory(optimizer=optimizer)).train()
    events = [s.event for s in lineage_events(result.store, "s")]
    selected = [e for e in events if e.type == "EditsSelected"]
    gates = [e for e in events if e.type == "GateDecided"]
    assert selected and all(not e.edits and {d.reason for d in e.dropped} == {"already_in_skill"}
                            for e in selected)
    assert all(g.decision == "skip" and g.reason.startswith("every proposed edit would change nothing")
               for g in gates)
    assert not [e for e in events if e.type in ("CandidateBuilt", "CandidateEvaluated")]

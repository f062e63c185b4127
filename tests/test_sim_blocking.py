"""The sim's blocking mode (`sim.blocking`): a broad line pins another task type low whatever the skill
holds, it arrives only with a right rule for another type, and the modes before it are unchanged."""

from __future__ import annotations

import json
import random

import pytest

from skillstate.config import SkillConfig
from skillstate.config_sources import build_config
from skillstate.sim.blockers import blockers
from skillstate.sim.noise import BLOCKING, KNOBS, MODERATE, SimNoise
from skillstate.sim.optimizer import SimOptimizer
from skillstate.sim.world import RULES, SimWorld, bundled_skill, bundled_splits
from skillstate.util import hash_value

ITEMS = [i for items in bundled_splits().values() for i in items]
TYPES = sorted(RULES)
ALL_RULES = bundled_skill().replace("- Always answer with a single word.\n", "") + "".join(
    f"- {RULES[t].variants[0]}\n" for t in TYPES)


def test_a_blocking_line_pins_its_type_whatever_the_skill_holds_and_only_that_type():
    world = SimWorld(ITEMS, SimNoise(blocking=0.5, block_level=0.1))
    assert sorted(b.blocks for b in world.blockers) == TYPES
    for line in world.blockers:
        assert not any(RULES[t].key in line.text.lower() for t in TYPES)  # it states no rule
        with_it = ALL_RULES + f"- {line.text}\n"
        assert world.chance(with_it, line.blocks) == pytest.approx(0.1)  # its type's own rule is inert
        assert world.chance(bundled_skill() + f"- {line.text}\n", line.blocks) <= 0.1
        for other in (t for t in TYPES if t != line.blocks):
            assert world.chance(with_it, other) == world.chance(ALL_RULES, other)
    # with the knob off the same line does nothing
    line = world.blockers[0]
    noisy = SimWorld(ITEMS, SimNoise(answer_noise=0.7, harmful_edits=0.25))
    assert noisy.chance(ALL_RULES + f"- {line.text}\n", line.blocks) == noisy.chance(ALL_RULES, line.blocks)
    assert SimWorld(ITEMS).blockers == () and SimWorld(ITEMS, SimNoise(**MODERATE)).blockers == ()


def test_a_type_without_a_written_line_gets_one_that_names_it():
    found = blockers(["arithmetic", "chemistry"])
    assert [b.blocks for b in found] == ["arithmetic", "chemistry"]
    assert "chemistry" in found[1].text and found[1].key in found[1].text.lower()


def _replies(noise: SimNoise, skill: str, n: int = 300) -> list[list[dict]]:
    optimizer = SimOptimizer(SimWorld(ITEMS, noise))
    out = []
    for k in range(n):
        failures = [{"task_type": TYPES[k % len(TYPES)]}] * 3
        out.append(optimizer._failure_analyst("", skill, failures, 4, random.Random(k), set(), []))
    return [json.loads(r).get("edits", []) if r.startswith("{") else [] for r in out]


def test_blocking_lines_arrive_only_with_a_right_rule_for_another_type_and_only_in_the_blocking_mode():
    world = SimWorld(ITEMS, SimNoise(**BLOCKING))
    keys = {b.key: b.blocks for b in world.blockers}
    replies = _replies(SimNoise(**BLOCKING), bundled_skill())
    carried = 0
    for edits in replies:
        for n, edit in enumerate(edits):
            hit = [t for k, t in keys.items() if k in edit["content"].lower()]
            if not hit:
                continue
            carried += 1
            rule = edits[n - 1]["content"].lower()  # the right rule it rides with comes just before it
            aimed = next(t for t in TYPES if RULES[t].key in rule)
            assert hit[0] != aimed
    assert carried >= 20
    for noise in (SimNoise(), SimNoise(**MODERATE)):
        assert not any(k in e["content"].lower() for edits in _replies(noise, bundled_skill()) for e in edits
                       for k in keys)


def test_the_modes_before_blocking_keep_their_tags_and_the_preset_turns_it_on():
    old = SimNoise(**MODERATE)
    assert old.tag() == "noisy-" + hash_value([getattr(old, k) for k in KNOBS])[:8]  # as before the knob
    assert SimNoise(**BLOCKING).tag() not in ("", old.tag())
    cfg = build_config(overrides={"sim.noise": "blocking", "sim.block_level": 0.2})
    assert cfg.sim.blocking == BLOCKING["blocking"] and cfg.sim.block_level == 0.2
    assert cfg.sim.answer_noise == MODERATE["answer_noise"]
    assert SimNoise.of(cfg.sim).on and not SimNoise.of(SkillConfig().sim).on
    assert SimNoise.of(build_config(overrides={"sim.noise": "moderate"}).sim) == old

"""Pruning (config key `prune`) and the gate's length penalty
(`gate_length_penalty`): the deterministic rule and the sim optimizer find
restated rules; a noisy run prunes through the gate, replays, verifies,
forks and explains a deleted line with `why`; early reject stays exact
with the length penalty in the gate metric."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner
from conftest import Crash, examples, small_config
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.cli.main import cli
from skillstate.engine.runner import make_backend
from skillstate.prompts import resolve_prompts
from skillstate.reading.audit import verify
from skillstate.sim.noise import MODERATE, SimNoise
from skillstate.sim.pruner import prune_reply
from skillstate.sim.world import SimWorld, bundled_splits
from skillstate.skillopt import gate
from skillstate.skillopt.gate_robust import Reference, RobustRule, robust_reject_point, type_values
from skillstate.skillopt.prune import NEAR_DUPLICATE, line_evidence, rule_deletions, whole_line_first
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

# the prune alone (the other mechanisms on by default left off)
NOISY = ("--set", "sim.noise=moderate", "--set", "blocker_search=off", "--set", "prune_blockers=false")


def call(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, res.output
    return res.output


def events(db: str, run_id: str, kind: str) -> list[dict]:
    return [e["payload"] for e in json.loads(call("log", run_id, "--json", "--db", db)) if e["type"] == kind]


# --- proposing ------------------------------------------------------------------------------------

SKILL = """# Question answering

## Rules
- For arithmetic, follow the order of operations: multiply and divide before adding.
- Keep answers short.
- Remember: for arithmetic, follow the order of operations: multiply and divide before adding.
- For weekday questions, count forward day by day, modulo 7, from the given day.
- keep answers short
"""


def test_the_rule_finds_restatements_and_duplicates_and_keeps_the_first_statement():
    found = {line: (reason, of) for line, reason, of in rule_deletions(SKILL)}
    assert found == {
        "- Remember: for arithmetic, follow the order of operations: multiply and divide before adding.":
            (NEAR_DUPLICATE, "- For arithmetic, follow the order of operations: multiply and divide before adding."),
        "- keep answers short": ("duplicate", "- Keep answers short."),
    }
    assert all(whole_line_first(SKILL, line) for line in found)
    assert rule_deletions("# T\n\n- One rule about dates.\n- Another about units.\n") == []


def test_the_sim_optimizer_proposes_deleting_paraphrases_not_the_rule_they_repeat():
    items = [i for split in bundled_splits({"train": 30, "val": 12, "test": 12}).values() for i in split]
    first = "- For arithmetic, follow the order of operations: multiply and divide before adding."
    paraphrase = "- In short, for arithmetic, follow the order of operations: multiply and divide before adding."
    skill = f"# Q\n\n## Rules\n{first}\n{paraphrase}\n- Keep answers short.\n"
    mistakes = {}
    for name, noise in (("clean", SimNoise()), ("noisy", SimNoise(**MODERATE))):
        world = SimWorld(items, noise)
        replies = [prune_reply(world, skill, 5, random.Random(seed), world.noise) for seed in range(200)]
        named = [json.loads(r)["delete"] for r in replies if r.startswith("{")]  # now and then it answers in prose
        assert len(named) >= 170
        assert sum(paraphrase in d for d in named) >= 0.7 * len(named)
        assert sum("- Keep answers short." in d for d in named) >= 0.7 * len(named)  # a line that does nothing
        mistakes[name] = sum(first in d for d in named) / len(named)
    # the rule the paraphrase repeats stays, except for the noisy mode's mistakes (harmful_edits of the time)
    assert mistakes["clean"] == 0 and 0.1 <= mistakes["noisy"] <= 0.4


def test_the_prompt_sees_each_line_with_the_step_that_added_it_and_its_gain():
    initial = "# T\n\n- Old rule.\n"
    one = initial + "- Added at step 2.\n"
    two = one + "- Added at step 5.\n"
    rows = line_evidence(initial, [(2, 0.1, one), (5, 0.05, two)], two)
    assert rows == [{"line": "- Old rule.", "added_at_step": None, "gain": None},
                    {"line": "- Added at step 2.", "added_at_step": 2, "gain": 0.1},
                    {"line": "- Added at step 5.", "added_at_step": 5, "gain": 0.05}]


def test_prune_is_a_prompt_a_run_may_override():
    assert "$prune_lines" in resolve_prompts({})["prune"]
    assert resolve_prompts({"prune": "Delete nothing. <prune_lines>$prune_lines</prune_lines>"})["prune"].startswith(
        "Delete nothing.")


# --- in a run -------------------------------------------------------------------------------------


def test_a_noisy_run_prunes_through_the_gate_replays_verifies_forks_and_why_names_the_prune(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    # the run this test reads was written before repair, the screen of rejected edits and the minibatch screen
    # were on by default
    out = call("run", "--run-id", "n", "--epochs", "2", *NOISY, "--set", "prune=step", "--set", "repair=off",
               "--set", "drop_rejected_edits=0", "--set", "edit_screen=off", "--db", db)
    assert "    prune      after step 1:" in out
    proposed, decided = events(db, "n", "PruneProposed"), events(db, "n", "PruneDecided")
    assert [p["after_step"] for p in proposed] == [d["after_step"] for d in decided] == list(range(1, 7))
    accepted = [(p, d) for p, d in zip(proposed, decided, strict=True) if d["decision"] in ("accept", "accept_best")]
    assert accepted and any(d["decision"] == "reject" for d in decided)
    rejected: set[tuple[str, str]] = set()
    for p, d in zip(proposed, decided, strict=True):  # a deletion turned down is not proposed again for that skill
        assert not any((p["base_skill"], line["line"]) in rejected for line in p["lines"])
        if d["decision"] == "reject":
            rejected |= {(p["base_skill"], line["line"]) for line in p["lines"]}
    for p, d in accepted:  # the pruned skill is the base without the deleted lines, and it scored higher
        assert d["candidate_score"] > d["current_score"] and p["skill"] and p["lines"]
        assert all(e["op"] == "delete" and e["source"] == "prune" for e in p["edits"])
        assert all(r["status"] == "applied" for r in p["report"])
    # a restatement deleted, the line it restated kept
    restated = [(line, p) for p, _ in accepted for line in p["lines"] if NEAR_DUPLICATE in line["reasons"]]
    assert restated
    line, p = restated[0]
    step = p["after_step"]
    after = call("replay", "n", "--to-step", str(step + 1), "--json", "--db", db)
    assert json.loads(after)["current_score"] is not None
    skill = call("export", "n", "--db", db)
    assert line["line"] not in skill

    assert "reproduces all" in call("replay", "n", "--verify", "--db", db)
    assert "intact" in call("audit", "n", "--db", db)

    # why: the line deleted by the prune, its reasons and the decision
    why = call("why", "--db", db, "--", "n", line["line"])
    assert f"prune after step {step} " in why and "removed by accept" in why and "near_duplicate" in why
    info = json.loads(call("why", "--json", "--db", db, "--", "n", line["line"]))
    removal = [c for c in info["changes"] if c["by"] == "prune"]
    assert removal and removal[0]["deleted"][0]["line"] == line["line"]

    # fork before the prune with pruning off, and at the epoch end with pruning per epoch: both verify
    call("fork", "n", f"step_{step}", "--set", "prune=off", "--run-id", "n-off", "-q", "--db", db)
    assert not events(db, "n-off", "PruneProposed")
    call("fork", "n", "step_3", "--set", "prune=epoch", "--run-id", "n-epoch", "-q", "--db", db)
    assert [p["after_step"] for p in events(db, "n-epoch", "PruneProposed")] == [3, 6]  # the fork prunes after 3
    for run_id in ("n-off", "n-epoch"):
        assert "reproduces all" in call("replay", run_id, "--verify", "--db", db)
    # the length penalty is fixed on fork: the recorded scores hold it
    res = CliRunner().invoke(cli, ["fork", "n", "step_2", "--set", "gate_length_penalty=0.01", "--db", db])
    assert res.exit_code == 2 and "gate_length_penalty" in res.output


def test_a_paired_run_prunes_through_the_paired_rule_and_the_length_penalty_is_in_the_gate(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    call("run", "--run-id", "p", "--epochs", "2", "-q", *NOISY, "--set", "prune=epoch", "--set", "gate_rule=paired",
         "--set", "gate_type_margin=0.2", "--set", "gate_length_penalty=0.01", "--db", db)
    decided = [d for d in events(db, "p", "PruneDecided") if d["decision"] != "skip"]
    assert decided and all(d["rule"] == "paired" and d["paired"] and d["type_guard"] for d in decided)
    base = events(db, "p", "BaselineEvaluated")[0]["scores"]
    initial = call("export", "p", "--step", "0", "--db", db)
    assert abs(base["length_cost"] - 0.01 * len(initial) / 100) < 1e-12
    assert base["gate"] == base["hard"] - base["length_cost"]
    assert "reproduces all" in call("replay", "p", "--verify", "--db", db)


def test_pruning_is_on_at_each_epochs_end_by_default_and_refused_in_bank_mode(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    call("run", "--run-id", "d", "--epochs", "1", "-q", "--db", db)
    assert [p["after_step"] for p in events(db, "d", "PruneProposed")] == [3]  # the epoch's last step
    assert all(g["scores"]["length_cost"] == 0 for g in events(db, "d", "CandidateEvaluated"))
    call("run", "--run-id", "off", "--epochs", "1", "-q", "--set", "prune=off", "--db", db)
    assert not events(db, "off", "PruneProposed")
    res = CliRunner().invoke(cli, ["run", "--set", "mode=bank", "--set", "prune=epoch", "--db", db])
    assert res.exit_code == 2 and "prune does not apply" in res.output and "Traceback" not in res.output
    call("run", "--run-id", "b", "--epochs", "1", "-q", "--set", "mode=bank", "--db", db)  # a bank leaves it off
    started = events(db, "b", "RunStarted")[0]["config"]
    assert (started["prune"], started["prune_blockers"], started["blocker_search"]) == ("off", False, "off")
    assert not events(db, "b", "PruneProposed")


# --- early reject stays exact with the length penalty -----------------------------------------------

score = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1, allow_nan=False))
penalty = st.one_of(st.just(0.0), st.sampled_from([0.001, 0.01, 0.05]), st.floats(0, 1, allow_nan=False))


@st.composite
def cases(draw):
    outcomes = draw(st.lists(st.tuples(st.sampled_from([0.0, 1.0]), score), min_size=1, max_size=40))
    order = draw(st.permutations(range(len(outcomes))))
    metric = draw(st.sampled_from(["hard", "soft", "mixed"]))
    cost = gate.length_cost("x" * draw(st.integers(0, 3000)), draw(penalty))
    current = draw(st.one_of(st.floats(-1, 1.5, allow_nan=False),
                             st.sampled_from([k / len(outcomes) - cost for k in range(len(outcomes) + 1)])))
    return outcomes, order, metric, draw(st.floats(0, 1, allow_nan=False)), cost, current


@examples(full=1500, sampled=300)
def test_with_a_length_penalty_an_early_reject_is_the_decision_a_full_evaluation_gives(max_examples):
    @given(cases())
    @settings(max_examples=max_examples, deadline=None)
    def check(case):
        outcomes, order, metric, weight, cost, current = case
        n = len(outcomes)
        ordered = [outcomes[i] for i in order]
        full = gate.with_density(gate.gate_score(sum(h for h, _ in outcomes) / n, sum(s for _, s in outcomes) / n,
                                                 metric, weight), 0.0, 0.0, cost)
        found = gate.early_reject_point(ordered, n, current, metric, weight, 0.0, 0.0, cost)
        if found is not None:
            k, bound = found
            assert 1 <= k < n and full <= bound + gate.ROUNDING_SLACK
            assert gate.decide(full, current, max(current, full)) == gate.REJECT
        # the robust bound with the strict rule agrees with it, and the paired rule's proves a reject only when
        # the full decision (score and sign test) is one
        current_items = [(0.0, 0.0, "") for _ in outcomes]
        for rule in (RobustRule("strict", 0.9, None, metric, weight), RobustRule("paired", 0.9, None, metric, weight)):
            ref = Reference(score=current, by_type=type_values(current_items, rule), outcomes=current_items)
            robust = robust_reject_point([(h, s, "") for h, s in ordered], ref, 0.0, rule, cost)
            if rule.rule == "strict":
                assert (robust[0] if robust else None) == (found[0] if found else None)
            elif robust is not None:
                assert full <= robust[1].bound + gate.ROUNDING_SLACK
                assert robust[1].strict_certain or not robust[1].paired.passed

    check()


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=30), st.integers(0, 30), st.integers(1, 2000))
@settings(max_examples=300, deadline=None)
def test_the_length_penalty_never_lets_a_tie_on_items_through_early_when_the_shorter_skill_wins(hards, wins, chars):
    # the current skill is longer by `chars` characters and ties on items: the candidate beats it by the cost
    # difference alone, so no prefix may prove a reject while every item left could still match it
    n = len(hards)
    wins = min(wins, n)
    cost_now = gate.length_cost("x" * (chars + 100), 0.01)
    cost = gate.length_cost("x" * 100, 0.01)
    current = wins / n - cost_now
    found = gate.early_reject_point([(h, h) for h in hards], n, current, "hard", 0.5, 0.0, 0.0, cost)
    if found is not None:
        k, _ = found
        assert sum(hards[:k]) + (n - k) < wins  # even every item left solved scores below the current items


# --- resume ------------------------------------------------------------------------------------------


def dies_deciding_a_prune():
    """A backend factory whose backends die (raise Crash) at the first target call after the prune prompt."""
    seen = {"prune": False}

    def factory(config, env, role):
        real = make_backend(config, env, role)

        class Dying:
            name = real.name

            def complete(self, request):
                text = request.message_dicts()[-1]["content"]
                if role == "optimizer" and "<prune_lines>" in text:
                    seen["prune"] = True
                elif role == "target" and seen["prune"]:
                    raise Crash()
                return real.complete(request)

        return Dying()

    return factory


def test_a_run_that_dies_between_a_prune_proposal_and_its_decision_resumes_to_the_same_log(tmp_path):
    cfg = small_config(num_epochs=1, prune="epoch", sim={"noise": "moderate"})
    whole, broken = Store(f"sqlite:///{tmp_path / 'w.db'}"), Store(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        Trainer(cfg, store=whole, run_id="r").train()
        with pytest.raises(Crash):
            Trainer(cfg, store=broken, run_id="r", backend_factory=dies_deciding_a_prune()).train()
        assert [e.type for e in broken.read_events("r")][-1] == "PruneProposed"
        Trainer(cfg, store=broken, run_id="r").train()  # resumed
        want = [(e.type, json.loads(e.payload)) for e in whole.read_events("r")]
        got = [(e.type, json.loads(e.payload)) for e in broken.read_events("r")]
        assert [t for t, _ in got] == [t for t, _ in want]
        decided = [(p["decision"], p["candidate_score"]) for t, p in got if t == "PruneDecided"]
        assert decided == [(p["decision"], p["candidate_score"]) for t, p in want if t == "PruneDecided"]
        assert verify(broken, "r").ok and verify(whole, "r").ok
    finally:
        whole.close()
        broken.close()

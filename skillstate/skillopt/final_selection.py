"""Beating the winner's curse: the final skill is picked on a held-out
selection split, not on val (the best-on-val skill is biased upward, since
val chose it). Here are the config section (`final_selection`), the seeded
rule that carves the selection split, and the pure choice rules; the stages
are in `skillstate.engine.final_select`, the events in
`skillstate.log.selection_events`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from skillstate.config_section import Section
from skillstate.util import seeded_rng

CARVED = "selection"  # the name of a carved selection split


class FinalSelectionConfig(Section):
    """Pick the final skill among the top accepted ones on a held-out selection split (off by default)."""

    enabled: bool = Field(False, description="After training, re-score the top accepted skills on the selection "
                                             "split and make the best there the run's final (best) skill.")
    top: int = Field(3, ge=1, le=50, description="How many accepted skills to re-score: the best on val and the "
                                                 "next ones by val score.")
    split: str | None = Field(None, description="A split of the data (--data DIR/<split>.jsonl) to select on; left "
                                                "out, the selection split is carved from carve_from.")
    carve_from: Literal["val", "train"] = Field(
        "val", description="The split the selection items are carved from (they leave it for the whole run).")
    size: int = Field(20, ge=1, description="How many items are carved (chosen by a shuffle seeded by the run's "
                                            "seed); the source keeps the others, in their order.")


def selection_split(cfg: FinalSelectionConfig) -> str:
    """The name of the selection split in the run's dataset."""
    return cfg.split or CARVED


def carve(items: Sequence[Mapping[str, Any]], size: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(kept, carved): `size` items chosen by a shuffle seeded by `seed`, each
    list in the input order. Deterministic: the same items and seed carve the
    same selection split on any machine."""
    if size >= len(items):
        raise ValueError(f"cannot carve {size} selection items from {len(items)}: leave at least one")
    order = list(range(len(items)))
    seeded_rng("final-selection", seed).shuffle(order)
    chosen = set(order[:size])
    return ([dict(it) for i, it in enumerate(items) if i not in chosen],
            [dict(it) for i, it in enumerate(items) if i in chosen])


@dataclass(frozen=True)
class Accepted:
    """A skill that was the run's current (or best) skill: where it came from and its val score."""

    skill: str
    step: int
    val: float


def ranked(accepted: Sequence[Accepted], best: str, top: int) -> list[Accepted]:
    """The candidates to re-score: the best skill first, then the other
    accepted skills by val score (higher first; on a tie the one accepted
    first), each skill once (its first appearance), `top` in all."""
    first: dict[str, Accepted] = {}
    for a in accepted:
        first.setdefault(a.skill, a)
    if best not in first:
        raise ValueError("the best skill is not among the accepted skills")
    order = list(first)
    others = sorted((s for s in order if s != best), key=lambda s: (-first[s].val, order.index(s)))
    return [first[s] for s in [best, *others][:top]]


def choose(selection_scores: Sequence[float]) -> int:
    """The index of the candidate picked: the highest selection score; on a
    tie the earlier candidate (so the best on val when it ties)."""
    if not selection_scores:
        raise ValueError("no candidates to choose from")
    return max(range(len(selection_scores)), key=lambda i: (selection_scores[i], -i))


def with_selection_split(config: Any, splits: dict[str, list[dict[str, Any]]],
                         env_cls: Any) -> dict[str, list[dict[str, Any]]]:
    """The run's splits with its selection split (`final_selection.enabled`):
    the named split of the data directory (read with the others, so an id in
    two splits is refused), or `size` items carved from
    `carve_from` by the seeded rule (`carve`, seeded by the run's seed), which
    then holds the others only. Off: the splits unchanged."""
    from skillstate.errors import ConfigError

    sel: FinalSelectionConfig = config.final_selection
    if not sel.enabled:
        return splits
    name = selection_split(sel)
    if name in (config.train_split, config.val_split, config.test_split):
        raise ConfigError(f"final_selection.split {name!r} is the train, val or test split: the selection split "
                          "must be held out from all three")
    if sel.split:
        if not config.data:
            raise ConfigError(f"final_selection.split {name!r} names a split of the data: pass --data DIR holding "
                              f"{name}.jsonl, or leave the key out to carve the selection split")
        return {**splits, name: env_cls.load_splits(config.data, [*splits, name])[name]}
    source = config.train_split if sel.carve_from == "train" else config.val_split
    try:
        kept, carved = carve(splits[source], sel.size, config.seed)
    except ValueError as err:
        raise ConfigError(f"final_selection.size: {err} ({sel.carve_from} split)") from None
    return {**splits, source: kept, name: carved}


def check_fork_selection(config: Any, dataset: Mapping[str, Any]) -> None:
    """A fork inherits its parent's splits: it can turn the final selection on
    only when the parent's dataset holds the selection split."""
    from skillstate.errors import ConfigError

    sel: FinalSelectionConfig = config.final_selection
    if sel.enabled and selection_split(sel) not in dataset:
        raise ConfigError(f"a fork inherits its parent's splits, and the parent has no {selection_split(sel)!r} "
                          "split: turn final_selection on when the run is created (or name a split it has)")

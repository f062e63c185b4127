"""The base of every config section (`skillstate.config`): the checks that
apply to every field, whatever its type, so that no key needs its own."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def leaf_types(annotation: Any) -> set[Any]:
    """The scalar types a field's annotation admits: `int | None` -> {int, None}."""
    if get_origin(annotation) is Literal:
        return {type(arg) for arg in get_args(annotation)}
    args = get_args(annotation)
    if not args:
        return {annotation}
    return set().union(*(leaf_types(arg) for arg in args))


def _leaves(value: Any, where: str = "") -> list[tuple[str, Any]]:
    """(where, scalar) of a value: itself, or the values of a mapping or sequence (not the keys)."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{where}{key}: ")]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item, where)]
    return [(where, value)]


def is_stored(info: ValidationInfo) -> bool:
    """Whether this validation reads back a config from a log (`skillstate.config_views.stored_config`)."""
    return bool(info.context and info.context.get("stored"))


class Section(BaseModel):
    """A part of the config. Besides each field's own type and bounds, every
    field refuses what would slip through pydantic's conversions unnoticed: a
    boolean where a number is meant (`num_epochs: true` is not 1), an empty or
    blank string anywhere a string is meant (`--model "$MODEL"` with MODEL
    unset is a mistake, not "not set": leave the key out for that), and NaN or
    infinite numbers. A config read back from a log (`stored_config`) is not
    held to these checks added later, so that older runs still resume and
    verify."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or is_stored(info):
            return value
        kinds = leaf_types(field.annotation)
        if Any in kinds or any(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds):
            return value  # free-form (env_config), or a section of its own that checks its fields
        for where, leaf in _leaves(value):
            if isinstance(leaf, bool) and bool not in kinds and kinds & {int, float}:
                raise ValueError(f"{where}expected a number, got {str(leaf).lower()}")
            if isinstance(leaf, str) and str in kinds and not leaf.strip():
                raise ValueError(f"{where}must not be empty (leave the key out to use its default)")
        return value

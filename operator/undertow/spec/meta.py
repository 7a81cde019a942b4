"""What every Undertow resource shares: the API group, object metadata, conditions, errors.

`SpecModel` is strict on purpose: an experiment file is a contract, so an unknown field,
a string where an int belongs or `acks: true` is an error rather than a guess.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "Conditions",
    "FieldError",
    "ObjectMeta",
    "Quantity",
    "SpecModel",
    "StatusModel",
    "field_aliases",
    "one_of",
]

GROUP = "undertow.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


class FieldError(ValueError):
    """A semantic error at `loc`, relative to the model that raised it.

    Model validators raise it so the loader can still name the exact field
    (`spec.faults[1].target.broker`) instead of the model as a whole.
    """

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


def field_aliases(model: type[BaseModel]) -> list[str]:
    """The keys a model accepts, as written in YAML."""
    return [field.alias or name for name, field in model.model_fields.items()]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase keys, unknown keys and type coercion rejected."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        use_attribute_docstrings=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = field_aliases(cls)
            for key in data:
                if key not in known:
                    raise FieldError((key,), cls.unknown_key_message(key, known))
        return data

    @classmethod
    def unknown_key_message(cls, key: Any, known: list[str]) -> str:
        return f"unknown field {key!r}; expected one of: {', '.join(known)}"


def one_of(*names: str) -> ConfigDict:
    """Config adding `oneOf: [{required: [a]}, ...]`: the API server then enforces the
    exactly-one-of rule the model validator enforces for files."""
    return ConfigDict(json_schema_extra={"oneOf": [{"required": [name]} for name in names]})


class StatusModel(BaseModel):
    """Base of status models: written by the operator, so lenient when read back."""

    model_config = ConfigDict(
        extra="ignore",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"invalid quantity {value!r}: expected e.g. '500m', '1Gi', '2'")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]
"""A Kubernetes resource quantity (`500m`, `1Gi`, `2`)."""


def _check_name(name: str) -> str:
    if len(name) > 63 or not re.fullmatch(DNS1123_LABEL, name):
        raise ValueError(
            f"invalid name {name!r}: a DNS-1123 label is at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return name


class ObjectMeta(BaseModel):
    """The part of Kubernetes object metadata Undertow reads; the API server owns the rest."""

    model_config = ConfigDict(extra="ignore", strict=True, use_attribute_docstrings=True)

    name: Annotated[str, AfterValidator(_check_name)]
    """A DNS-1123 label: it names the broker pods and the runner's output directory."""
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Condition(StatusModel):
    """A Kubernetes status condition (`metav1.Condition`)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]
"""Conditions keyed by type, as `metav1.Condition` lists are (server-side apply merges them)."""

"""The building blocks of the API models: a base class whose cross-field rules
exist once, as CEL for the API server and as Python for the models.

Each :class:`Rule` carries the CEL expression the CRD generator writes into
``x-kubernetes-validations`` and, next to it, the same check in Python. The two
are kept side by side so a reviewer reads them together, and the property test
(apiserver vs. models) proves they agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of a model.

    ``cel`` sees the object as ``self`` (and ``oldSelf`` for a transition rule,
    which has no Python mirror: the models never see the old object).
    ``message`` names the field, ``field_path`` (relative, ``.a.b``) tells the
    API server which field to blame.
    """

    cel: str
    message: str
    check: Callable[[Any], bool] | None
    field_path: str | None = None
    reason: str | None = None
    # A message with the offending values: CEL for the API server, a function
    # of the model for Python. ``message`` stays the fallback.
    message_expression: str | None = None
    describe: Callable[[Any], str] | None = None

    def to_schema(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        if self.field_path:
            entry["fieldPath"] = self.field_path
        if self.reason:
            entry["reason"] = self.reason
        return entry


class RuleViolation(ValueError):
    """A model's cross-field rule failed; carries the field it blames."""

    def __init__(self, rule: Rule, model: Any) -> None:
        super().__init__(rule.describe(model) if rule.describe else rule.message)
        self.rule = rule


def _add_rules_to_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(model, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]


class ApiModel(BaseModel):
    """Base of the spec models: camelCase on the wire, unknown keys rejected,
    cross-field :attr:`rules` enforced in Python and exported to the CRD."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        # Strict like the API server: "3" is not an integer, 1 is not a boolean.
        strict=True,
        json_schema_extra=_add_rules_to_schema,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in type(self).rules:
            if rule.check is not None and not rule.check(self):
                raise RuleViolation(rule, self)
        return self


class StatusModel(BaseModel):
    """Base of the status models: written by the operator, read leniently so an
    older or newer operator's extra status fields never break a reconcile."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
    )


def section(model: type[BaseModel], description: str) -> Any:
    """A nested object that is always present: the API server creates it as
    ``{}`` and fills its own defaults, exactly as the model's default factory."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def _unique(items: list[Hashable] | None) -> list[Hashable] | None:
    if items is not None and len(set(items)) != len(items):
        duplicates = sorted({str(item) for item in items if items.count(item) > 1})
        raise ValueError(f"duplicate values: {', '.join(duplicates)}")
    return items


def unique_list(item_type: Any) -> Any:
    """A list type whose items are unique; the API server enforces it through
    ``x-kubernetes-list-type: set``."""
    return Annotated[
        list[item_type],
        AfterValidator(_unique),
        Field(json_schema_extra={"x-kubernetes-list-type": "set"}),
    ]


# Kubernetes resource.Quantity syntax (from apimachinery), non-negative only.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be a non-negative quantity")
        return value
    if not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)")
    return value


# A resource quantity written as an integer ("cpu: 4") or a string ("16Gi").
Quantity = Annotated[
    StrictInt | Annotated[StrictStr, StringConstraints(max_length=64)],
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == string || self >= 0",
                    "message": "must be a non-negative quantity",
                }
            ],
        }
    ),
]

# Names of other objects (PVCs, priority classes, schedulers): DNS-1123 subdomains.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DnsSubdomain = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
]
# Label values (the Kueue queue name is one).
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LabelValue = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)
]
# Label keys (a node label naming a topology level): an optional DNS-subdomain
# prefix and "/", then a name of at most 63 characters (the bounded repeat says
# so where a length limit on the whole key cannot).
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=253 + 1 + 63, pattern=LABEL_KEY_PATTERN)
]
# Extended resource names such as rdma/ib or nvidia.com/gpu: domain-qualified.
RESOURCE_NAME_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
ResourceName = Annotated[
    str, StringConstraints(min_length=3, max_length=253, pattern=RESOURCE_NAME_PATTERN)
]

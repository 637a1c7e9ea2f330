"""What every cache policy is, and the one way to name and build one.

A policy (a stage-2 slot policy of the AnchorMass cache, docs/method.md §2.6, or a KV policy of
the Standard cache, §3) is a dataclass: its fields are its hyperparameters plus `budget`, the
store size it keeps (slots or tokens, `budget_unit`). The budget is bound once, up front, by
`bind`, which also validates every field, so a cache holds a policy that is ready to act.
Each kind has one `PolicyRegistry` (name -> class) and builds its policies through it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping

from anchormass.errors import ConfigError


@dataclass
class Policy:
    name: ClassVar[str] = ""
    budget_unit: ClassVar[str] = "slots"

    budget: int | None = None  # the store size this policy keeps (budget_unit)

    def bind(self, budget: int | None) -> "Policy":
        """A validated copy with `budget` filled in (the argument wins if the field is unset)."""
        if budget is not None and self.budget is not None and int(budget) != int(self.budget):
            raise ConfigError(f"{self.name}: budget given twice ({self.budget} on the policy, {budget} on the cache)")
        bound = dataclasses.replace(self, budget=int(budget) if budget is not None else self.budget)
        bound.resolve()
        return bound

    def resolve(self) -> None:
        """Check the fields and derive dependent ones; raise ConfigError with one line."""
        if self.budget is None:
            raise ConfigError(f"{self.name}: a budget ({self.budget_unit}) is required")
        if self.budget < 1:
            raise ConfigError(f"{self.name}: budget must be >= 1 ({self.budget_unit}), got {self.budget}")


class PolicyRegistry(Mapping[str, type]):
    """The policies of one kind by name; `build` makes a bound instance from a name or an instance."""

    def __init__(self, kind: str, base: type[Policy], classes: list[type[Policy]]):
        self.kind, self.base = kind, base
        self._classes = {cls.name: cls for cls in classes}

    def __getitem__(self, name: str) -> type[Policy]:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def build(self, spec: "str | Policy", budget: int | None, **hyper: Any) -> Policy:
        """`spec` by name (its class takes those of `hyper` it has fields for) or an instance of the
        base class, bound to `budget`."""
        if isinstance(spec, self.base):
            return spec.bind(budget)
        if not isinstance(spec, str) or spec not in self._classes:
            raise ConfigError(f"unknown {self.kind} {spec!r}; choose one of {sorted(self._classes)}")
        cls = self._classes[spec]
        own = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in hyper.items() if k in own}).bind(budget)

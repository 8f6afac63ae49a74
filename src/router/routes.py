"""The router's action space and the weak (supervision) labels derived from ground truths.

Routes are the three actions the router head samples; their integer values are the logit
columns of ``router_logits`` ([P, 3]). Weak labels add ``MIXED`` for examples whose ground truth
fits no single route (several families, or tools that are neither search nor calculate):
MIXED is not an action, it means "no supervised signal" and maps to ``MIXED_INDEX`` (-1), which
callers pass as ``ignore_index`` to the cross-entropy term.
"""

from __future__ import annotations

from enum import Enum, IntEnum

__all__ = ["MIXED_INDEX", "Route", "WeakLabel", "parse_route", "weak_label_index"]


class Route(IntEnum):
    """Router actions; the value is the column in the router's logits."""

    ANSWER = 0
    SEARCH = 1
    CALCULATE = 2

    @property
    def label(self) -> str:
        """Lower-case name used in logs and configs: "answer", "search", "calculate"."""
        return self.name.lower()


class WeakLabel(str, Enum):
    """Per-example weak label from the ground truth's tool calls (values are the stored strings)."""

    ANSWER = "ANSWER"
    SEARCH = "SEARCH"
    CALCULATE = "CALCULATE"
    MIXED = "MIXED"

    def route(self) -> Route | None:
        """The route this label supervises, or None for MIXED."""
        return None if self is WeakLabel.MIXED else Route[self.value]


MIXED_INDEX = -1

_ALIASES = {"search-family": "search", "calculate-family": "calculate", "calc": "calculate"}


def parse_route(value: Route | int | str) -> Route:
    """A Route from itself, its index (0..2) or its name in any case ("search", "SEARCH-FAMILY").

    Raises ValueError naming the bad value.
    """
    if isinstance(value, Route):
        return value
    if isinstance(value, bool):
        raise ValueError(f"route must be a Route, an index 0..2 or a name, got {value!r}")
    if isinstance(value, int):
        try:
            return Route(value)
        except ValueError:
            raise ValueError(
                f"route index {value} is not one of 0 (answer), 1 (search), 2 (calculate)"
            ) from None
    if isinstance(value, str):
        key = value.strip().lower()
        key = _ALIASES.get(key, key)
        for route in Route:
            if route.label == key:
                return route
    raise ValueError(f"unknown route {value!r}; expected answer, search or calculate")


def weak_label_index(label: WeakLabel | str) -> int:
    """Class index for the cross-entropy term: the route's value, or MIXED_INDEX for MIXED."""
    route = WeakLabel(label).route()
    return MIXED_INDEX if route is None else int(route)

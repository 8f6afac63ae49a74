"""The one error a bad job config raises: every problem found, each naming its key."""

from __future__ import annotations


class ConfigError(ValueError):
    """A job config that cannot run. ``problems`` lists ``"<key>: <what is wrong>"`` lines."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the job config:\n{lines}")

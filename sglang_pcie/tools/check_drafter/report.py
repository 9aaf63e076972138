"""What every check shares: its statuses, its result (a Check), the error for unreadable input, number words."""
from __future__ import annotations

from dataclasses import dataclass, field

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


class InputError(Exception):
    """Unreadable input or bad usage: exit 2."""


@dataclass
class Check:
    name: str
    status: str
    reason: str
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"check": self.name, "status": self.status, "reason": self.reason, **self.data}


def count(n: int) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"

"""Helpers of the adversarial suite (no tests here): the tally of cases, seeded mutators of JSON-like values, and
the verdict of one case.

A case is an input built by a mutation together with what the contract demands of it: `MUST_REFUSE` (a clean,
documented error and nothing changed), `MUST_ACCEPT` (the mutation is harmless and the call must work), or
`EITHER` (a changed but possibly valid input: the call may work or refuse, but only with a documented error).
"""

from __future__ import annotations

import copy
import enum
import random
from dataclasses import dataclass, field


class Want(enum.Enum):
    MUST_REFUSE = "refuse"
    MUST_ACCEPT = "accept"
    EITHER = "either"


@dataclass
class Tally:
    """Cases tried, cases where every claim held, and a description of every broken one."""

    name: str
    tried: int = 0
    held: int = 0
    broken: list[str] = field(default_factory=list)

    def record(self, what: str, problem: str | None) -> None:
        self.tried += 1
        if problem is None:
            self.held += 1
        else:
            self.broken.append(f"{what}: {problem}")

    def verdict(self, what: str, want: Want, refused: BaseException | None, allowed: tuple[type, ...],
                unchanged: bool = True) -> None:
        """Record a case from how the call ended (`refused`: the exception or None) and whether the state it must
        not touch on refusal is unchanged."""
        if refused is not None and not isinstance(refused, allowed):
            self.record(what, f"raised {type(refused).__name__}: {str(refused)[:160]}")
        elif refused is not None and "\n" in str(refused):
            self.record(what, f"a multi-line error: {str(refused)[:160]!r}")
        elif refused is not None and not unchanged:
            self.record(what, "refused but changed state")
        elif refused is not None and want is Want.MUST_ACCEPT:
            self.record(what, f"refused a valid input: {str(refused)[:160]}")
        elif refused is None and want is Want.MUST_REFUSE:
            self.record(what, "accepted an input it must refuse")
        else:
            self.record(what, None)

    def summary(self) -> str:
        return f"{self.name}: {self.tried} tried, {self.held} held, {len(self.broken)} broken"

    def check(self) -> None:
        print(f"\nadversarial {self.summary()}")
        assert not self.broken, self.summary() + "\n" + "\n".join(self.broken[:20])


WEIRD = [True, False, None, 0, -1, 1.5, float("inf"), 2 ** 62 + 1, 2 ** 80, -(2 ** 63), "", "x", "0" * 64, "9",
         [], [1, 2], {}, {"a": 1}, [[[]]], "x" * 5000]


def weird(rng: random.Random) -> object:
    return copy.deepcopy(rng.choice(WEIRD))


def mutate_json(value: object, rng: random.Random, depth: int = 0) -> tuple[object, str]:
    """One random structural change somewhere inside a JSON-like value: a value replaced by a weird one, a key
    deleted or added, a list entry dropped, duplicated or swapped; returns (new value, what changed)."""
    v = copy.deepcopy(value)
    if isinstance(v, dict) and v and (depth < 3 and rng.random() < 0.5):
        k = rng.choice(sorted(v))
        v[k], what = mutate_json(v[k], rng, depth + 1)
        return v, f"{k}.{what}"
    if isinstance(v, list) and v and (depth < 3 and rng.random() < 0.5):
        i = rng.randrange(len(v))
        v[i], what = mutate_json(v[i], rng, depth + 1)
        return v, f"[{i}].{what}"
    op = rng.randrange(4)
    if isinstance(v, dict) and v and op == 0:
        k = rng.choice(sorted(v))
        del v[k]
        return v, f"del {k}"
    if isinstance(v, dict) and op == 1:
        v[rng.choice(["extra", "note", "position2", "__proto__"])] = weird(rng)
        return v, "extra key"
    if isinstance(v, list) and v and op == 0:
        i = rng.randrange(len(v))
        return v[:i] + v[i + 1:], f"drop [{i}]"
    if isinstance(v, list) and v and op == 1:
        i = rng.randrange(len(v))
        return v[:i + 1] + [copy.deepcopy(v[i])] + v[i + 1:], f"dup [{i}]"
    if isinstance(v, list) and len(v) > 1 and op == 2:
        i, j = rng.sample(range(len(v)), 2)
        v[i], v[j] = v[j], v[i]
        return v, f"swap [{i}] [{j}]"
    if isinstance(v, int) and not isinstance(v, bool) and op == 2:
        return v + rng.choice([-1, 1, 7, -(2 ** 40)]), "int nudged"
    new = weird(rng)
    return new, f"= {str(new)[:20]!r}"

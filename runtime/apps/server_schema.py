"""What every body `edgespec serve` takes is checked with: `BadRequest` (OpenAI's error body, a
400 naming the field unless it says otherwise), numbers checked before any conversion, and the
speculation a request or `/admin/speculation` may ask for, bounded by the engine folder's
abilities (`Abilities`: its drafters, largest k, token trees, context). A completion body is
checked in server_request.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from edgespec.runtime.drafters import UnknownDrafterError, spec_of
from edgespec.runtime.tree import TreeConfig

ERROR_TYPES = {
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "overloaded",
}


class BadRequest(ValueError):
    """A request the server refuses, with the fields of OpenAI's error body."""

    def __init__(self, msg: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(msg)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Abilities:
    """What one loaded engine folder can be asked for."""

    drafters: tuple[str, ...]  # the drafters this folder and backend can run
    tree_drafters: tuple[str, ...]  # those that can draft token trees with this folder's graphs
    k_max: int  # largest num_speculative_tokens (verify graphs of widths 2..k_max+1)
    context: int  # KV slots: prompt + output tokens


@dataclass(frozen=True)
class Speculation:
    """How one request is decoded (the server's default, or a request's `speculative` field)."""

    drafter: str  # a registered drafter the folder can run (Abilities.drafters)
    k: int  # num_speculative_tokens (kept with drafter none, for a later switch back)
    tree: TreeConfig = TreeConfig()  # token trees when nodes > 0, else chains

    def to_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "tree": self.tree.label if self.tree.nodes else None}


# no integer field means more than this; past it float() overflows on a huge JSON integer and numpy's
# int64 wraps, so it is checked before any conversion
INT_LIMIT = 2**63 - 1
TREE_SPEC_CHARS = 64  # a --tree spec is a few small numbers: a longer one is refused before parsing


def shown(v) -> str:
    """v for a message: an integer too long to print whole by its size (the reply stays one line)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT_LIMIT:
        return f"an integer of {len(str(abs(v)))} digits"
    return repr(v) if isinstance(v, str) else str(v)


def number_field(
    body: dict,
    key: str,
    default,
    integer: bool = False,
    lo=None,
    hi=None,
    lo_open: bool = False,
    param: str | None = None,
):
    """body[key] checked: a finite number (an integer when asked) in [lo, hi] ((lo, hi] when lo_open)."""
    v, param = body.get(key), param or key
    if v is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"'{param}' must be {kind}, got {shown(v)[:80]}", param)
    # a JSON integer is a Python int of any size: math.isfinite and float() would overflow on 10**400,
    # while comparing an int with a float is exact, so the bounds come first and convert nothing
    if isinstance(v, float) and not math.isfinite(v):
        raise BadRequest(f"'{param}' must be a finite number, got {v}", param)
    if integer and isinstance(v, float) and not v.is_integer():
        raise BadRequest(f"'{param}' must be an integer, got {v}", param)
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        low = f"({lo}" if lo_open else f"[{lo}"
        raise BadRequest(f"'{param}' must be in {low}, {'inf' if hi is None else hi}], got {shown(v)}", param)
    if abs(v) > INT_LIMIT:  # only integer fields without their own bound get here with such a value
        raise BadRequest(f"'{param}' must be at most {INT_LIMIT} (2**63 - 1), got {shown(v)}", param)
    return int(v) if integer else float(v)


def _bounded_tree(tree: TreeConfig) -> TreeConfig:
    """A parsed tree made safe to run. A branch past the drafter's vocabulary would fail mid-answer
    (the heads' top-b), and a parent never gets more than nodes-1 children, so branch is read as at
    most nodes-1: the same tree. Depth and beam past the size are harmless (the drafters stop when
    the tree is full) and kept. min_score is a path probability: nan would cut nothing, inf all."""
    if not tree.nodes:
        return tree
    if not 0.0 <= tree.min_score <= 1.0:  # also refuses nan
        raise ValueError(f"min_score={tree.min_score} outside [0, 1]: it is a path probability (0 = off)")
    return dataclasses.replace(tree, branch=min(tree.branch, tree.nodes - 1))


def parse_speculation(spec, default: Speculation, ab: Abilities, param: str = "speculative") -> Speculation:
    """`{"drafter", "k", "tree"}` over `default` (a field left out keeps the default's; a drafter
    that cannot draft trees gets chains)."""
    if not isinstance(spec, dict) or set(spec) - {"drafter", "k", "tree"}:
        raise BadRequest(
            f"'{param}' must be an object with optional 'drafter', 'k' and 'tree', got {shown(spec)[:80]}", param
        )
    name = spec.get("drafter", default.drafter)
    try:  # an alias answers as its drafter (prompt_lookup is ngram), as on the CLI (drafters.spec_of)
        drafter = spec_of(name).name if isinstance(name, str) else None
    except UnknownDrafterError:
        drafter = None
    if drafter is None:
        raise BadRequest(
            f"{param}.drafter {shown(name)[:80]}: choose one of {', '.join(ab.drafters)}", f"{param}.drafter"
        )
    if drafter not in ab.drafters:
        raise BadRequest(
            f"{param}.drafter {name!r} is not available in this engine folder (it has {', '.join(ab.drafters)})",
            f"{param}.drafter",
        )
    k = number_field(spec, "k", default.k, integer=True, param=f"{param}.k")
    # drafter none keeps k for a later switch back, so a k given with it is checked as well: a bad one
    # would stick in the server's default and make every later change that leaves k out fail
    if (drafter != "none" or "k" in spec) and not 1 <= k <= ab.k_max:
        raise BadRequest(
            f"{param}.k={k} outside 1..{ab.k_max}: this folder has verify graphs up to "
            f"num_speculative_tokens={ab.k_max}",
            f"{param}.k",
        )
    tree = default.tree if "tree" not in spec else spec["tree"]
    if tree in (None, "", "none"):
        tree = TreeConfig()
    elif isinstance(tree, str):
        try:
            if len(tree) > TREE_SPEC_CHARS:
                raise ValueError(f"a spec of {len(tree)} characters; at most {TREE_SPEC_CHARS} are read")
            tree = TreeConfig.parse(tree)
            tree.check(ab.k_max + 1)
            tree = _bounded_tree(tree)
        except ValueError as e:
            raise BadRequest(f"{param}.tree: {e}", f"{param}.tree") from e
    elif not isinstance(tree, TreeConfig):
        raise BadRequest(
            f"{param}.tree must be a string NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]], e.g. "
            f"'6:5:1:1', or null for chains; got {shown(tree)[:80]}",
            f"{param}.tree",
        )
    if tree.nodes and drafter not in ab.tree_drafters:
        if "tree" in spec:
            raise BadRequest(
                f"{param}.tree: drafter {drafter!r} cannot draft token trees with this folder (these "
                f"can: {', '.join(ab.tree_drafters) or 'none'})",
                f"{param}.tree",
            )
        tree = TreeConfig()  # the default's tree belongs to a tree drafter; this one drafts chains
    return Speculation(drafter, k, tree if drafter != "none" else TreeConfig())

"""The Engine protocol declares what the runtime reads of a target engine (engines/base.py), and every
engine implements all of it: the runtime reads no member through a getattr fallback."""

import ast
import inspect
import textwrap

from edgespec.engines.base import Engine


def _protocol_members() -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(Engine)))
    body = tree.body[0].body
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    return names | {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _members(cls) -> set[str]:
    """What a class and its bases define or assign to self (read from their source: no engine is loaded)."""
    found = set()
    for c in cls.__mro__[:-1]:
        found |= set(vars(c))
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(c)))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    found.add(node.attr)
    return found


def test_every_engine_implements_the_protocol():
    from edgespec.engines.fake import FakeModel
    from edgespec.engines.ort import OrtModel
    from edgespec.engines.trt import TrtModel

    want = _protocol_members()
    assert {"last_topk", "top_k", "manifest", "spec"} <= want
    for cls in (FakeModel, OrtModel, TrtModel):
        assert want <= _members(cls), (cls.__name__, sorted(want - _members(cls)))

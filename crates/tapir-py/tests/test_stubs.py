"""The stubs (python/tapir/_tapir.pyi) list exactly the native module's public names."""

import ast
import pathlib

import tapir
from tapir import _tapir

STUB = pathlib.Path(tapir.__file__).with_name("_tapir.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {
                n.name if isinstance(n, ast.FunctionDef) else n.target.id
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
            }
    return top, members


def test_every_public_name_of_the_module_has_a_stub_and_back():
    top, members = stub_names()
    public = {n for n in dir(_tapir) if not n.startswith("_")}
    assert public == top, f"missing stubs: {public - top}; stale stubs: {top - public}"
    # Slots PyO3 adds by itself, not written by us.
    implicit = {"__eq__", "__ne__", "__hash__", "__delitem__", "__init__", "__repr__", "__exit__"}
    for cls, names in members.items():
        real = {n for n in vars(getattr(_tapir, cls)) if n not in ("__doc__", "__module__", "__new__")}
        assert real - implicit <= names, f"{cls}: no stub for {sorted(real - implicit - names)}"
        assert names - {"__init__", "__exit__"} <= real, f"{cls}: stale stubs {sorted(names - real)}"


def test_every_public_method_has_a_docstring_or_is_an_operator():
    for cls in (tapir.Graph, tapir.Scope, tapir.Var, tapir.Tensor, tapir.ParamStore, tapir.GradBuffer, tapir.Optimizer):
        undocumented = [
            n for n, v in vars(cls).items() if not n.startswith("_") and callable(v) and not (v.__doc__ or "").strip()
        ]
        assert not undocumented, f"{cls.__name__}: {undocumented}"

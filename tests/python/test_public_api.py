"""The package's public surface, without a GPU: ``lfce.__all__`` is the list docs/architecture.md
documents, every name in it exists, the package is marked typed (py.typed) and every public
function and method carries complete annotations (what mypy and a user's editor read)."""

import inspect
import os
import re
import typing

import pytest

import lfce
import lfce.compat.cce
import lfce.compat.liger
import lfce.distributed
import lfce.options

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                   "architecture.md")


def documented_names():
    """The names in the fenced block of docs/architecture.md's section "The Python package"."""
    with open(DOC, encoding="utf-8") as doc:
        text = doc.read()
    section = text.split("## The Python package", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block, "docs/architecture.md: no fenced list of public names under 'The Python package'"
    return sorted(block.group(1).split())


def test_all_lists_exactly_the_documented_public_names():
    assert sorted(lfce.__all__) == documented_names()
    assert len(set(lfce.__all__)) == len(lfce.__all__), "a name listed twice"


def test_every_public_name_exists_and_internal_helpers_are_not_listed():
    missing = [name for name in lfce.__all__ if not hasattr(lfce, name)]
    assert not missing, f"lfce.__all__ names {missing}, which lfce does not have"
    assert "library_version" in lfce.__all__ and callable(lfce.library_version)
    internal = [name for name in lfce.__all__ if name.startswith("_") and name != "__version__"]
    assert not internal, internal
    # A star import gives exactly the listed names.
    scope = {}
    exec("from lfce import *", scope)  # noqa: S102 - the behaviour under test
    assert sorted(k for k in scope if k != "__builtins__") == sorted(lfce.__all__)


def test_the_package_is_marked_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(lfce.__file__), "py.typed"))


PUBLIC_MODULES = [lfce, lfce.distributed, lfce.compat.liger, lfce.compat.cce, lfce.options]


def public_callables():
    """(qualified name, function) of each public function, class constructor and public method."""
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value):
                yield f"{module.__name__}.{name}", value
            elif inspect.isclass(value) and not issubclass(value, BaseException):
                for attr, member in vars(value).items():
                    if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                        yield f"{module.__name__}.{name}.{attr}", member


@pytest.mark.parametrize("name, function", list(public_callables()), ids=[n for n, _ in public_callables()])
def test_every_public_function_is_annotated(name, function):
    signature = inspect.signature(function)
    bare = [p.name for p in signature.parameters.values()
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    assert not bare, f"{name}: parameters without an annotation: {bare}"
    assert signature.return_annotation is not inspect.Signature.empty, f"{name}: no return annotation"


def test_reduction_and_mode_are_literal_types_of_the_values_the_library_takes():
    hints = typing.get_type_hints(lfce.linear_cross_entropy)
    assert typing.get_args(hints["reduction"]) == tuple(lfce._lib.REDUCTIONS) == ("mean", "sum", "none")
    assert typing.get_args(hints["mode"]) == tuple(lfce._lib.MODES) == ("recompute", "eager")
    assert hints["options"] == typing.Optional[lfce.LossOptions]

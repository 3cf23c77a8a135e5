"""Sphinx extension: the kernel reference, generated from the kernel contract's registry when the pages are built.

* ``.. kernel-contract::`` writes one section per registered check: the family's file, the kernel function(s)
  beside the twin, the twin, the simulator shapes and the planted controls;
* ``:contract-count:`kernels``` and ``:contract-count:`controls``` write the number of registered checks and of
  planted controls, so that no page has to state a count that could go stale.

Both read `tensorfold.contract.registry()`, the list `tensorfold contract` runs.
"""
import sys
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def checks():
    from tensorfold.contract import registry
    return registry()


def counts() -> dict:
    """{"kernels": registered checks, "controls": planted controls over all checks}."""
    registered = checks()
    return {"kernels": len(registered), "controls": sum(len(check.controls) for check in registered)}


def qualified_name(obj) -> tuple:
    """(module-qualified name, what it is) of a kernel or of a function that builds kernels.

    A numba dispatcher, or the cached launch that wraps one, carries the Python function it compiled as `py_func`;
    anything else named in a check's `kernels` is a plain function: a factory that builds a kernel per shape or
    format (it defines them inside it), or, under numba's CUDA simulator, a device function emulated on the host."""
    function = getattr(obj, "py_func", None)
    kind = "kernel"
    if function is None:  # a factory defines the kernels it builds; a device function emulated on the host does not
        function = obj
        code = getattr(function, "__code__", None)
        if code is not None and any(isinstance(c, types.CodeType) for c in code.co_consts):
            kind = "factory"
    module = getattr(function, "__module__", None) or ""
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or repr(function)
    return (f"{module}.{name}" if module else name), kind


def public(function) -> bool:
    name = getattr(function, "__name__", "")
    return bool(name) and not name.startswith(("<", "_"))


class KernelContractDirective(SphinxDirective):
    """`.. kernel-contract::`: one section per registered kernel check."""

    def run(self):
        import numpy as np

        lines = []
        for check in checks():
            kernels = [qualified_name(k) for k in getattr(check, "kernels", ()) or ()]
            cases_module = check.launch.__module__
            family = list(dict.fromkeys(name.rsplit(".", 1)[0] for name, _ in kernels)) or [cases_module]
            title = f"``{check.name}``"
            lines += [title, "~" * len(title), ""]
            doc = (sys.modules[family[0]].__doc__ or "").strip() if family[0] in sys.modules else ""
            if doc:
                lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
            files = ", ".join(f"``{module.replace('.', '/')}.py``" for module in family)
            lines.append(f"* file{'s' if len(family) > 1 else ''}: {files} (twin and kernel side by side)")
            if kernels:
                named = ", ".join(f"``{name}``" + ("" if kind == "kernel" else f" ({kind})") for name, kind in kernels)
                lines.append(f"* kernel{'s' if len(kernels) > 1 else ''}: {named}")
            if public(check.twin):
                lines.append(f"* twin: ``{check.twin.__module__}.{check.twin.__qualname__}``")
            if cases_module not in family:
                lines.append(f"* cases and controls: ``{cases_module.replace('.', '/')}.py``")
            labels = [label for label, _ in check.cases("sim", np.random.default_rng(0))]
            lines.append("* simulator shapes: " + ", ".join(f"``{label}``" for label in labels))
            lines.append("* planted controls: " + (", ".join(check.controls) or "none"))
            lines.append("")
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source="kernel-contract"), container)
        return container.children


def contract_count_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """`:contract-count:`kernels`` or `:contract-count:`controls``: the registry's count, as plain text."""
    key = text.strip()
    known = counts()
    if key not in known:
        message = inliner.reporter.error(f"contract-count takes 'kernels' or 'controls', not {key!r}", line=lineno)
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    return [nodes.Text(str(known[key]))], []


def setup(app):
    app.add_directive("kernel-contract", KernelContractDirective)
    app.add_role("contract-count", contract_count_role)
    return {"parallel_read_safe": True}

"""Sphinx configuration for the tensorfold documentation.

Build from the repository root with `sphinx-build -W -b html docs docs/_build/html` (warnings are errors).
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # document the package in this checkout, installed or not
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))  # this documentation's own extensions

import tensorfold  # noqa: E402  (needs the path above)

project = "tensorfold"
author = "the tensorfold authors"
copyright = "the tensorfold authors"
release = tensorfold.__version__
version = release

# The docstrings are prose, without "Args:" / "Returns:" sections, so napoleon is left out: it would read a
# property docstring's "Title: text" first line as a type annotation.
extensions = [
    "sphinx.ext.autodoc",  # API pages from docstrings
    "sphinx.ext.viewcode",  # links from the API pages to highlighted source
    "side_by_side",  # a twin and its kernel in two columns (docs/_ext)
]

# The package's docstrings mark names and expressions with single backticks: show them as inline code.
default_role = "code"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_theme_options = {
    "description": "Qwen3.5 inference, twin by twin",
    "fixed_sidebar": True,
}


# The kernel reference page is generated from the kernel contract's registry, so it lists exactly what
# `tensorfold contract` checks.
from docutils import nodes  # noqa: E402
from docutils.statemachine import StringList  # noqa: E402
from sphinx.util.docutils import SphinxDirective  # noqa: E402
from sphinx.util.nodes import nested_parse_with_titles  # noqa: E402


class KernelContractDirective(SphinxDirective):
    """`.. kernel-contract::` -- one section per registered kernel check: its twin, its shapes, its controls."""

    def run(self):
        import numpy as np
        from tensorfold.contract import registry

        lines = []
        for check in registry():
            twin = getattr(check.twin, "__name__", "")
            module = check.launch.__module__
            title = f"``{check.name}``"
            lines += [title, "~" * len(title), ""]
            summary = sys.modules[module].__doc__.strip().split("\n\n")[0].replace("\n", " ")
            lines += [summary, ""]
            lines.append(f"* file: ``{module.replace('.', '/')}.py`` (twin and kernel side by side)")
            if twin and not twin.startswith(("<", "_")):
                lines.append(f"* twin: ``{check.twin.__module__}.{twin}``")
            labels = [label for label, _ in check.cases("sim", np.random.default_rng(0))]
            lines.append("* simulator shapes: " + ", ".join(f"``{label}``" for label in labels))
            lines.append("* planted controls: " + ", ".join(check.controls))
            lines.append("")
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines), container)
        return container.children


def setup(app):
    app.add_directive("kernel-contract", KernelContractDirective)

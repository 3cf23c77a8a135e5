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
    "kernel_reference",  # the kernel reference and the contract's counts, from its registry (docs/_ext)
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


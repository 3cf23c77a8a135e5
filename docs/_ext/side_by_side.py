"""Sphinx extension: a tutorial's twin and kernel shown side by side (filled in with the tutorials)."""


def setup(app):
    return {"parallel_read_safe": True}

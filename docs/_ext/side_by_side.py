"""Sphinx extension: a NumPy twin and its CUDA kernel in two columns, as the tutorials print them.

    .. side-by-side:: deltanet_apply,_decay_and_write deltanet_apply_kernel
       :module: tensorfold.cuda.deltanet

       ("for r in path", "for p in range(path.shape[0])")

The two arguments are the twin's side and the kernel's side, each one function or several joined by commas (a
name with a dot is a full path, any other is looked up in `:module:`). Each line of the content pairs a text of
the twin with a text of the kernel, written as a Python tuple: the first line of each side containing its text
starts on the same row, after the previous pair's (the `align` of the tutorials' `show`). `:width:` is the width
of a column in characters.

The cutting and wrapping are the tutorials' own (tutorials/_side_by_side.py, loaded from its file), so a page
shows what a terminal shows. The HTML is a table with one row per aligned piece, a highlighted literal block in
each cell; other builders get one literal block of both columns, the terminal's layout.
"""
import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

HELPER = Path(__file__).resolve().parents[2] / "tutorials" / "_side_by_side.py"
COLUMN = 52  # characters a column: two fit the page's body at the stylesheet's font size

# The table fills the body and its padding; its cells keep their code unwrapped (a row too wide scrolls), and a
# dotted rule marks where the two sides are aligned again.
CSS = """
table.docutils.side-by-side { width: calc(100% + 60px); margin: 1em -30px; table-layout: fixed;
                              border-collapse: collapse; }
table.docutils.side-by-side th { text-align: left; font-weight: normal; font-size: 0.8em;
                                 padding: 2px 8px; border: none; }
table.docutils.side-by-side td { width: 50%; vertical-align: top; padding: 0; border: none; }
table.docutils.side-by-side tbody tr + tr td { border-top: 1px dotted #bbb; }
table.docutils.side-by-side td + td, table.docutils.side-by-side th + th { border-left: 1px solid #ccc; }
table.docutils.side-by-side div.highlight, table.docutils.side-by-side pre { margin: 0; }
table.docutils.side-by-side pre { font-size: 11px; line-height: 1.4; padding: 2px 8px; overflow-x: auto;
                                  white-space: pre; border: none; box-shadow: none; }
"""


def load_helper():
    spec = importlib.util.spec_from_file_location("tutorials_side_by_side", HELPER)
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    return helper


helper = load_helper()


class SideBySide(SphinxDirective):
    """`.. side-by-side:: twin[,more] kernel[,more]`: the two sources in a two-column table."""

    required_arguments = 2
    has_content = True
    option_spec = {"module": directives.unchanged, "width": directives.positive_int}

    def functions(self, argument):
        found = []
        for name in argument.split(","):
            path = name if "." in name else f"{self.options.get('module', '')}.{name}"
            module, _, attribute = path.rpartition(".")
            try:
                found.append(getattr(importlib.import_module(module), attribute))
            except (ImportError, AttributeError, ValueError) as error:
                raise self.error(f"side-by-side: cannot import {path!r}: {error}") from error
        return found

    def alignment(self):
        pairs = []
        for line in self.content:
            if not line.strip():
                continue
            try:
                pair = ast.literal_eval(line.strip())
            except (ValueError, SyntaxError) as error:
                raise self.error(f"side-by-side: not a pair of strings: {line!r}") from error
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(text, str) for text in pair)):
                raise self.error(f"side-by-side: not a pair of strings: {line!r}")
            pairs.append(pair)
        return pairs

    def run(self):
        twin, kernel = (self.functions(argument) for argument in self.arguments)
        width = self.options.get("width", COLUMN)
        try:
            pieces = helper.segments(helper.listing(twin), helper.listing(kernel), self.alignment())
        except ValueError as error:
            raise self.error(f"side-by-side: {error}") from error
        for function in twin + kernel:  # a change to a shown file, or to the layout, rebuilds the page
            self.env.note_dependency(inspect.getsourcefile(inspect.unwrap(getattr(function, "py_func", function))))
        self.env.note_dependency(str(HELPER))

        table = nodes.table(classes=["side-by-side"])
        group = nodes.tgroup(cols=2)
        table += group
        group += [nodes.colspec(colwidth=width), nodes.colspec(colwidth=width)]  # characters, for text builders
        head = nodes.thead()
        group += head
        head += self.row([self.title("twin", twin), self.title("kernel", kernel)])
        body = nodes.tbody()
        group += body
        for left, right in pieces:
            if left or right:
                body += self.row([self.code(helper.wrap(left, width)),
                                  self.code(helper.wrap(right, width))])
        html = addnodes.only(expr="html")
        html += table
        # Other builders reflow a table cell's lines: they get the columns as one block, as a terminal shows them.
        text = "\n".join(helper.columns(twin, kernel, self.alignment(), 2 * width + len(helper.BAR)))
        plain = addnodes.only(expr="not html")
        plain += nodes.literal_block(text, text, language="none")
        return [html, plain]

    @staticmethod
    def row(cells):
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            if cell is not None:
                entry += cell
            row += entry
        return row

    @staticmethod
    def title(label, functions):
        paragraph = nodes.paragraph(text=f"{label}: ")
        for n, name in enumerate(helper.names(functions).split(", ")):
            paragraph += [nodes.Text(", ")] if n else []
            paragraph += nodes.literal(text=name)
        return paragraph

    @staticmethod
    def code(rows):
        if not rows:
            return None
        text = "\n".join(rows)
        block = nodes.literal_block(text, text, language="python")
        block["force"] = True  # a wrapped row may cut a string in two: highlight it anyway, without a warning
        return block


def write_css(app, exception):
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        (static / "side_by_side.css").write_text(CSS)


def setup(app):
    app.add_directive("side-by-side", SideBySide)
    app.add_css_file("side_by_side.css")
    app.connect("build-finished", write_css)
    return {"parallel_read_safe": True}

"""A twin and its kernel in two columns: the helper the tutorials print their listings with (not a tutorial).

`show(twin, kernel, align)` prints the source of the NumPy twin on the left and of the CUDA kernel on the right.
Either side may be a list of functions, listed one after the other. `align` pairs a text of the twin with a text
of the kernel, in reading order: the first line of each side that contains its text (after the previous pair's)
starts on the same row, with the comments and decorators just above it, so that the loops that do the same work
face each other. Between those rows each side is simply top-aligned.

A line wider than its column is wrapped: a docstring's or a comment's paragraph is refilled at its indent, a
trailing comment moves onto its own line above its statement, and a statement is broken at a space outside its
strings, the least deep in brackets (after an assignment's `=` or a comma where it can be), its later rows
indented four more.

The documentation draws the same columns (docs/_ext/side_by_side.py loads this file): `segments` cuts both sides
at the aligned lines and `wrap` fits a piece of a side to a column, whatever draws them.
"""
import collections
import inspect
import io
import textwrap
import tokenize

WIDTH = 120  # a terminal's columns: two columns and the bar between them
BAR = " | "

# One physical line of source: its code and its comment (trailing, or the whole line when code is empty), whether
# it lies in a docstring (prose), and the first row of the statement it belongs to (a statement may span rows).
Line = collections.namedtuple("Line", "code comment prose statement")


def function_source(function):
    """The source of a function, of a numba dispatcher's Python function, or of a kernel factory, dedented."""
    return textwrap.dedent(inspect.getsource(getattr(function, "py_func", function)))


def source_lines(function):
    """A function's source as `Line`s, from Python's own tokenizer (so a '#' in a string is no comment)."""
    text = function_source(function)
    comments, prose, statement, first = {}, set(), {}, None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        (row, col), (end_row, _) = token.start, token.end
        if token.type == tokenize.COMMENT:
            comments[row] = col
        elif token.type == tokenize.STRING and token.string.lstrip("rbuRBU")[:3] in ('"""', "'''"):
            prose.update(range(row, end_row + 1))
        if token.type == tokenize.NEWLINE and first is not None:
            statement.update((r, first) for r in range(first, end_row + 1))
            first = None
        elif first is None and token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                                                  tokenize.NEWLINE, tokenize.ENDMARKER):
            first = row
    lines = []
    for row, line in enumerate(text.rstrip().splitlines(), start=1):
        code = line[:comments.get(row, len(line))].rstrip()
        comment = line[len(code):].lstrip() if code else line.rstrip() if row in comments else ""
        lines.append(Line(code, comment, row in prose, statement.get(row, row)))
    return lines


def _as_list(functions):
    return list(functions) if isinstance(functions, (list, tuple)) else [functions]


def listing(functions):
    """The lines of one side: a function, or several with a blank line between them."""
    lines = []
    for n, function in enumerate(_as_list(functions)):
        blank = [Line("", "", False, (n, 0))] if lines else []
        lines += blank + [line._replace(statement=(n, line.statement)) for line in source_lines(function)]
    return lines


def names(functions):
    """The functions' names with their file's (`gemv.gemv_kernel`), as a column's title."""
    functions = [getattr(f, "py_func", f) for f in _as_list(functions)]
    return ", ".join(f"{f.__module__.rpartition('.')[2]}.{f.__name__}" for f in functions)


def _find(lines, text, after):
    """(where the piece starts, the line) for the first line past `after` that contains `text`: the piece starts
    at its statement's first row, moved up over the comments and decorators just above it, which belong to it."""
    for at in range(after + 1, len(lines)):
        if text in lines[at].code + lines[at].comment:
            start = at
            while start - 1 > after and lines[start - 1].statement == lines[at].statement:
                start -= 1
            while start - 1 > after and (lines[start - 1].code.lstrip().startswith("@") or
                                         (lines[start - 1].comment and not lines[start - 1].code)):
                start -= 1
            return start, at
    raise ValueError(f"no line of the listing contains {text!r}" + (f" after line {after + 1}" if after >= 0 else ""))


def segments(left, right, align):
    """Both listings cut before each aligned pair of lines: [(left lines, right lines), ...], in order."""
    cuts, found = [(0, 0)], (-1, -1)
    for left_text, right_text in align:
        (left_cut, left_at), (right_cut, right_at) = (_find(left, left_text, found[0]),
                                                      _find(right, right_text, found[1]))
        cuts.append((left_cut, right_cut))
        found = (left_at, right_at)
    cuts.append((len(left), len(right)))
    return [(left[a:b], right[c:d]) for (a, c), (b, d) in zip(cuts, cuts[1:])]


def _indent(text):
    return text[:len(text) - len(text.lstrip())]


def _fill(text, width, indent, prefix=""):
    """A paragraph's words refilled to `width`, every row starting with indent + prefix."""
    return textwrap.wrap(text, width, initial_indent=indent + prefix, subsequent_indent=indent + prefix,
                         break_long_words=True, break_on_hyphens=False)


def _break_at(code, start, width):
    """Where to break `code`, a row longer than `width` whose first `start` characters are the indent. After an
    assignment's `=` when the value then fits on one row; else at a space outside a string that leaves the row at
    least half full, the least deep in brackets, after a comma if one is, and the last of those; else at the last
    space outside a string, after the last opening bracket, at the last space, or at the width itself."""
    quote, depth, spaces, opens, anywhere, assign = None, 0, [], [], [], None
    for i, char in enumerate(code[:width + 1]):
        if char == " " and i > start:
            anywhere.append(i)
        if quote:
            quote = None if char == quote and code[i - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
            opens.append(i + 1)
        elif char in ")]}":
            depth -= 1
        elif char == " " and i > start:
            spaces.append((depth, code[i - 1] != ",", i))
            if assign is None and depth == 0 and code[i - 2:i] == " =" and code[i - 3] not in "=<>!+-*/%&|^":
                assign = i
    if assign is not None and start + len(code) - assign - 1 <= width:
        return assign
    full = [(depth, not_comma, -i) for depth, not_comma, i in spaces if i >= width // 2]
    if full:
        return -min(full)[2]
    for candidates in ([i for _, _, i in spaces], [i for i in opens if start < i <= width], anywhere):
        if candidates:
            return candidates[-1]
    return width


def _wrap_statement(lines, width):
    """A statement (one or more rows) that does not fit: its comments above it, then its code joined and broken."""
    indent = _indent(lines[0].code)
    rows = []
    comment = " ".join(line.comment.lstrip("#").strip() for line in lines if line.comment)
    if comment:
        rows += _fill(comment, width, indent, "# ")
    code = lines[0].code
    for line in lines[1:]:
        part = line.code.strip()
        code += part if code.endswith(("(", "[", "{")) or part.startswith((")", "]", "}")) else " " + part
    more = " " * min(len(indent) + 4, width - 24)  # later rows: four deeper than the statement
    while len(code) > width:
        cut = _break_at(code, len(more), width)
        rows.append(code[:cut].rstrip())
        code = more + code[cut:].lstrip()
    return rows + [code]


def _whole(line):
    return line.code + ("  " if line.code and line.comment else "") + line.comment


def _paragraph(line):
    """A docstring's row that may join the paragraph above it: not blank, nor its closing quotes alone."""
    return line.prose and line.code.strip() not in ("", '"""', "'''")


def _joins(last, line):
    """Whether `line` wraps together with the row `last` above it."""
    if _paragraph(last) and _paragraph(line):  # a docstring's paragraph: one indent, up to the closing quotes
        return (line.statement == last.statement and _indent(line.code) == _indent(last.code)
                and not last.code.rstrip().endswith(('"""', "'''")))
    if line.code and not line.prose and not last.prose:  # the rows of one statement
        return line.statement == last.statement
    if line.comment and not line.code and last.comment and not last.code:  # a paragraph of comments
        return _indent(line.comment) == _indent(last.comment)
    return False


def _runs(lines):
    """The lines in runs that wrap as one: a statement, a paragraph of a docstring, a paragraph of whole-line
    comments at one indent, or a row alone."""
    runs = []
    for line in lines:
        if runs and _joins(runs[-1][-1], line):
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def wrap(lines, width):
    """A piece of one side as rows of at most `width` characters (runs that fit are kept as written)."""
    rows = []
    for run in _runs(lines):
        if all(len(_whole(line)) <= width for line in run):
            rows += [_whole(line) for line in run]
        elif run[0].prose:
            rows += _fill(" ".join(line.code.strip() for line in run), width, _indent(run[0].code))
        elif not run[0].code:  # whole-line comments: one paragraph
            indent = _indent(run[0].comment)
            rows += _fill(" ".join(line.comment.lstrip().lstrip("#").strip() for line in run), width, indent,
                          "# ")
        else:
            rows += _wrap_statement(run, width)
    return rows


def columns(twin, kernel, align=(), width=WIDTH):
    """The rows of the two columns, `width` characters wide with the bar."""
    column = (width - len(BAR)) // 2

    def side_by_side(left, right):
        return [f"{left[n] if n < len(left) else '':<{column}}{BAR}{right[n] if n < len(right) else ''}".rstrip()
                for n in range(max(len(left), len(right)))]

    rows = side_by_side(_fill("twin: " + names(twin), column, ""), _fill("kernel: " + names(kernel), column, ""))
    rows.append("-" * column + BAR.replace(" ", "-") + "-" * column)
    for left, right in segments(listing(twin), listing(kernel), align):
        rows += side_by_side(wrap(left, column), wrap(right, column))
    return rows


def show(twin, kernel, align=(), width=WIDTH):
    """Print the twin (left) and the kernel (right) side by side; see the module's docstring for `align`."""
    print("\n".join(columns(twin, kernel, align, width)))
    print()

"""One policy for student-made text in the graded notebook: sanitise it or drop it, here and nowhere else.

The executed notebook under ``course/autograded/`` is opened by instructors in formgrader, which renders it
with nbconvert's HTML exporter *without* sanitising: a markdown cell's raw HTML, a ``text/html`` output or an
``application/javascript`` output would run as script in the instructor's logged-in session, where it can send
formgrader's own API requests (rewrite any student's grade). Everything in that notebook that a student or the
kernel made goes through :func:`clean_notebook` before the notebook is written:

* markdown cells are rendered by nbconvert's own markdown renderer (the one formgrader uses) and the HTML is
  sanitised, then stored as one inert HTML block, so the instructor sees the same formatting and math;
* outputs keep ``text/plain``, strictly base64 PNG and JPEG images, and sanitised ``text/html``
  (``text/markdown`` becomes sanitised HTML); active or unparsable kinds (``application/javascript``,
  ``image/svg+xml``, widget views, LaTeX, anything else) are dropped and replaced by a line of text saying so;
  output metadata is dropped (the template writes some of it into attributes and turns ``isolated`` into an
  iframe);
* stream names, error fields and execution counts are forced to the types the template expects.

Why ``nh3``: it is the Python binding of the Rust ``ammonia`` crate, an allow-list sanitiser built on a
spec-compliant HTML5 parser (html5ever); it is maintained, and ``bleach``'s maintainers point to it now that
bleach is deprecated (nbconvert's own ``clean_html`` filter still uses bleach). Its defaults drop
``script``/``style`` with their content, every ``on*`` and ``style`` attribute, ``javascript:`` and ``data:``
URLs, ``svg``, ``math``, ``iframe``, ``object`` and ``form``; ``id`` and ``class`` are dropped too, so a
student's markup cannot restyle formgrader's page or shadow the ids of its score boxes.
"""
from __future__ import annotations

import re

import nbformat
import nh3

# Output kinds kept as they are (after the checks below); everything else is dropped with a note.
TEXT, HTML, MARKDOWN, PNG, JPEG = "text/plain", "text/html", "text/markdown", "image/png", "image/jpeg"
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def clean_html(html: str) -> str:
    """``html`` with everything that could run script, load from elsewhere or restyle the page removed."""
    return nh3.clean(html, link_rel="noopener noreferrer nofollow")


def markdown_to_safe_html(source: str) -> str:
    """A markdown text rendered as formgrader would render it, sanitised, as one line of HTML.

    One line (newlines as ``&#10;``) inside a ``<div>`` is a single HTML block for every CommonMark renderer,
    so when formgrader renders the cell again the sanitised HTML passes through as it is; ``$...$`` math
    stays text, which MathJax typesets on the page.
    """
    from nbconvert.filters.markdown import markdown2html

    html = clean_html(markdown2html(source))
    return "<div>" + html.replace("\r", "").replace("\n", "&#10;") + "</div>"


def _text(value: object) -> str:
    """A mime bundle's text value (nbformat allows a list of lines); anything else becomes empty."""
    if isinstance(value, list):
        value = "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def clean_data(data: dict) -> dict:
    """A display's mime bundle reduced to the kinds the policy keeps, with a note for what it dropped."""
    out: dict[str, str] = {}
    if HTML in data:
        out[HTML] = clean_html(_text(data[HTML]))
    elif MARKDOWN in data:
        out[HTML] = markdown_to_safe_html(_text(data[MARKDOWN]))
    for kind in (PNG, JPEG):
        value = _text(data.get(kind))
        if value and _BASE64.fullmatch(value):
            out[kind] = value
    text = _text(data.get(TEXT))
    dropped = sorted(k for k in data if k not in out and k not in (TEXT, HTML, MARKDOWN))
    if dropped:
        note = f"[the grader dropped this output's {', '.join(dropped)}: active or unsupported content]"
        text = f"{text}\n{note}" if text else note
    if text or not out:
        out[TEXT] = text
    return out


def clean_output(output: dict) -> nbformat.NotebookNode:
    """One output of a code cell under the policy (see the module docstring)."""
    kind = output.get("output_type")
    if kind == "stream":
        name = output.get("name") if output.get("name") in ("stdout", "stderr") else "stdout"
        return nbformat.v4.new_output("stream", name=name, text=_text(output.get("text")))
    if kind == "error":
        traceback = output.get("traceback")
        lines = [_text(line) for line in traceback] if isinstance(traceback, list) else []
        return nbformat.v4.new_output("error", ename=_text(output.get("ename")),
                                      evalue=_text(output.get("evalue")), traceback=lines)
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    if kind == "execute_result":
        count = output.get("execution_count")
        return nbformat.v4.new_output("execute_result", data=clean_data(data),
                                      execution_count=count if type(count) is int else None)
    if kind == "display_data":
        return nbformat.v4.new_output("display_data", data=clean_data(data))
    return nbformat.v4.new_output("stream", name="stdout",
                                  text=f"[the grader dropped an output of type {str(kind)[:40]!r}]\n")


def clean_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with every markdown cell and every output made safe to render (in place; also returned)."""
    for cell in nb.cells:
        cell.pop("attachments", None)   # a markdown cell's attachments are files the renderer would link
        if cell.cell_type == "markdown":
            cell.source = markdown_to_safe_html(_text(cell.source))
        elif cell.cell_type == "code":
            cell.outputs = [clean_output(o) for o in cell.get("outputs", []) if isinstance(o, dict)]
            if type(cell.get("execution_count")) is not int:
                cell.execution_count = None
    return nb

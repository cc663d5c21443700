"""The policy for student-made text (autograder.untrusted) and formgrader's Content-Security-Policy, fast."""
from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

import xss_payloads as xss
from autograder import formgrader_csp, untrusted

REPO = Path(__file__).resolve().parents[2]
ACTIVE_TAGS = {"script", "svg", "math", "iframe", "frame", "object", "embed", "style", "link", "meta", "base",
               "form", "input", "textarea", "button"}


class _Active(HTMLParser):
    """Collects everything in an HTML text that could run script, load a URL or restyle the page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ACTIVE_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on") or name in ("style", "id", "class", "srcdoc", "formaction"):
                self.found.append(f"{tag}[{name}]")
            elif name in ("href", "src", "action") and not value.startswith(("http:", "https:", "#", "x")):
                self.found.append(f"{tag}[{name}={value[:20]}]")


def active(html: str) -> list[str]:
    parser = _Active()
    parser.feed(html)
    return parser.found


@pytest.mark.parametrize("name", sorted(xss.MARKDOWN))
def test_markdown_payloads_come_out_inert(name):
    cleaned = untrusted.markdown_to_safe_html(xss.MARKDOWN[name])
    assert active(cleaned) == [], cleaned
    assert "url(" not in cleaned and "javascript:" not in cleaned


def test_all_payloads_in_one_answer_come_out_inert_and_the_honest_text_stays():
    cleaned = untrusted.markdown_to_safe_html(xss.markdown_answer())
    assert active(cleaned) == [] and xss.MARKER not in cleaned.replace("XSS-LINK", "")
    assert "$(-x)^3 = -(x^3)$" in cleaned and "<strong>the sign comes out</strong>" in cleaned
    assert "The end of the answer." in cleaned


def test_formatting_math_and_code_survive_and_formgrader_renders_the_result_unchanged():
    from nbconvert.filters.markdown import markdown2html

    source = ("# Title\n\n> quoted, a < b & c\n\nInline `x<y`, $a<b$ and\n\n$$\\sum_i x_i < 3$$\n\n"
              "```python\na = 1\n\nb = '<script>'\n```\n\n1. one\n2. *two* [docs](https://example.org)\n")
    cleaned = untrusted.markdown_to_safe_html(source)
    for kept in ("<h1>Title", "<blockquote>", "a &lt; b &amp; c", "<code>x&lt;y</code>", "$a&lt;b$",
                 "$$\\sum_i x_i &lt; 3$$", "&#10;&#10;", "&lt;script&gt;", "<ol>", "<em>two</em>",
                 'href="https://example.org"'):
        assert kept in cleaned, kept
    assert "\n" not in cleaned and active(cleaned) == []
    assert markdown2html(cleaned).strip() == cleaned


def _visible_text(html_text: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", html_text))).replace("\u00b6", "").strip()


@pytest.mark.parametrize("assignment", ["policy_gradients", "crafting_agent"])
def test_the_course_markdown_keeps_all_its_text_after_sanitising(assignment):
    from nbconvert.filters.markdown import markdown2html

    nb = nbformat.read(REPO / "assignments" / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert cells
    for source in cells:
        cleaned = untrusted.markdown_to_safe_html(source)
        assert _visible_text(cleaned) == _visible_text(markdown2html(source)), source[:80]
        assert markdown2html(cleaned).strip() == cleaned


def _output(kind: str, value: object, **extra) -> dict:
    return nbformat.v4.new_output("display_data", data={kind: value, "text/plain": "fallback"}, **extra)


@pytest.mark.parametrize("kind", ["application/javascript", "image/svg+xml", "text/latex",
                                  "application/vnd.jupyter.widget-view+json", "application/x-unknown"])
def test_active_or_unknown_outputs_become_a_line_of_text(kind):
    value = {"model_id": "x"} if kind.endswith("+json") else xss.js("out")
    out = untrusted.clean_output(_output(kind, value))
    assert set(out.data) == {"text/plain"}
    note = f"[the grader dropped this output's {kind}: active or unsupported content]"
    assert out.data["text/plain"] == "fallback\n" + note


def test_html_and_markdown_outputs_are_sanitised_and_metadata_is_dropped():
    payload = '<b>table</b><img src=x onerror="' + xss.js("out-html") + '"><script>1</script>'
    out = untrusted.clean_output(_output("text/html", payload, metadata={"text/html": {"isolated": True}}))
    assert out.data["text/html"] == '<b>table</b><img src="x">' and out.metadata == {}
    out = untrusted.clean_output(_output("text/markdown", "**md** " + payload))
    assert set(out.data) == {"text/html", "text/plain"} and active(out.data["text/html"]) == []
    assert "<strong>md</strong>" in out.data["text/html"]


def test_images_are_kept_only_as_strict_base64():
    good = untrusted.clean_output(_output("image/png", "iVBORw0KGgo=\n"))
    assert good.data["image/png"] == "iVBORw0KGgo=\n" and good.data["text/plain"] == "fallback"
    bad = untrusted.clean_output(_output("image/jpeg", 'x" onerror="alert(1)'))
    assert "image/jpeg" not in bad.data and "dropped this output's image/jpeg" in bad.data["text/plain"]


def test_stream_error_and_result_fields_get_the_types_the_template_expects():
    stream = untrusted.clean_output({"output_type": "stream", "name": "x onclick=1", "text": ["a", "b"]})
    assert (stream.name, stream.text) == ("stdout", "ab")
    error = untrusted.clean_output({"output_type": "error", "ename": 3, "evalue": "<b>",
                                    "traceback": ["t", 4]})
    assert (error.ename, error.evalue, error.traceback) == ("", "<b>", ["t", ""])
    result = untrusted.clean_output({"output_type": "execute_result", "execution_count": "1<script>",
                                     "data": {"text/plain": "1"}, "metadata": {}})
    assert result.execution_count is None
    odd = untrusted.clean_output({"output_type": "clear_output"})
    assert odd.output_type == "stream" and "dropped an output of type 'clear_output'" in odd.text


def test_clean_notebook_covers_every_markdown_cell_and_output():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(xss.MARKDOWN["md-script"],
                                      attachments={"a.png": {"image/png": "AA=="}}),
        nbformat.v4.new_code_cell("x", execution_count=2,
                                  outputs=[_output("text/html", "<script>1</script>ok")]),
    ])
    nb.cells[1].execution_count = "2<script>"
    untrusted.clean_notebook(nb)
    assert "script" not in nb.cells[0].source and "attachments" not in nb.cells[0]
    assert nb.cells[1].outputs[0].data["text/html"] == "ok" and nb.cells[1].execution_count is None
    nbformat.validate(nb)


PAGE = (b'<html><head><script src="/static/a.js"></script><script>var submission_id = "1";</script>'
        b'<span onclick="toggle_name(true);"></span></head>'
        b'<body><div class="container" id="notebook-container">'
        b'<script>steal()</script><img src=x onerror="steal()"></div></body></html>')


def test_the_policy_allows_the_templates_inline_scripts_by_hash_and_nothing_after_the_notebook_starts():
    policy = formgrader_csp.policy("/formgrader/submissions/1/", PAGE)
    script_src = policy.split(";")[0].split()
    allowed = [formgrader_csp._hash(b'var submission_id = "1";'), formgrader_csp._hash(b"toggle_name(true);")]
    assert script_src == ["script-src", "'self'", "'unsafe-hashes'", *sorted(allowed)]
    assert formgrader_csp._hash(b"steal()") not in policy and "'unsafe-inline'" not in script_src
    assert "img-src 'self' data:" in policy and "object-src 'none'" in policy


def test_a_submission_page_without_the_notebook_marker_allows_no_inline_script():
    page = PAGE.replace(b'id="notebook-container"', b"")
    assert formgrader_csp.policy("/formgrader/submissions/1/", page).startswith("script-src 'self';")
    # formgrader's other pages show no notebook: their inline scripts are the template's
    assert formgrader_csp._hash(b"steal()") in formgrader_csp.policy("/formgrader/manage_assignments", page)


def _transformed(path: str, status: int, content_type: str | None, body: bytes) -> dict:
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    headers = HTTPHeaders({"Content-Security-Policy": "frame-ancestors 'self'"})   # Jupyter's default
    if content_type:
        headers["Content-Type"] = content_type
    transform = formgrader_csp.PolicyTransform(HTTPServerRequest(
        start_line=RequestStartLine("GET", path, "HTTP/1.1"), headers=HTTPHeaders({"Host": "localhost"})))
    return dict(transform.transform_first_chunk(status, headers, body, True)[1].get_all())


def test_the_server_sends_the_policy_on_formgraders_pages_and_keeps_it_through_a_304():
    page = _transformed("/formgrader/submissions/1/", 200, "text/html; charset=UTF-8", PAGE)
    assert page["Content-Security-Policy"] == formgrader_csp.policy("/formgrader/submissions/1/", PAGE)
    assert page["Cache-Control"] == "no-store"
    assert "Content-Security-Policy" not in _transformed("/formgrader/submissions/1/", 304, None, b"")
    script = _transformed("/formgrader/static/js/formgrade.js", 200, "application/javascript", b"x")
    assert script["Content-Security-Policy"] == "frame-ancestors 'self'"
    lab = _transformed("/lab", 200, "text/html", PAGE)
    assert lab["Content-Security-Policy"] == "frame-ancestors 'self'"

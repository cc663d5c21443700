"""A Jupyter server extension: a Content-Security-Policy on formgrader's pages that runs only its own scripts.

Defence in depth behind :mod:`autograder.untrusted`: should student-made HTML ever reach a submission page
unsanitised, the browser still refuses to run it. Jupyter's ``tornado_settings`` headers are one fixed
string, and formgrader's templates carry inline scripts (some with the submission's id in them), so a fixed
policy either allows every inline script or breaks formgrader. This extension sets the policy per response
instead: on formgrader's HTML pages only the inline scripts and event handlers of the page's *template part*
may run, each allowed by its SHA-256 hash. On a submission page the template part is everything before the
notebook container, where nbconvert starts writing the notebook; a submission page without that marker gets no
inline script at all. Other pages of the server (JupyterLab's) keep Jupyter's own headers.

Loaded by ``autograder/jupyter_formgrader_config.py``, which ``python -m autograder.formgrader`` passes to
``jupyter server``.
"""
from __future__ import annotations

import base64
import hashlib
import html
import re

from tornado import httputil
from tornado.web import OutputTransform

UNTRUSTED_START = b'id="notebook-container"'   # nbgrader's formgrade template: the notebook follows
_INLINE_SCRIPT = re.compile(rb"<script\b([^>]*)>(.*?)</script\s*>", re.S | re.I)
_HANDLER = re.compile(rb"""\son[a-z]+\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)
# Everything but script is limited to the server itself: no external image, font, frame or form target that
# could carry data away. Inline styles stay allowed (formgrader's templates use them; a style runs nothing).
_FIXED = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
          "frame-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'")


def _hash(text: bytes) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text).digest()).decode() + "'"


def trusted_part(path: str, body: bytes) -> bytes:
    """The part of a formgrader page that its template wrote (see the module docstring)."""
    if "/formgrader/submissions/" not in path:
        return body
    end = body.find(UNTRUSTED_START)
    return body[:end] if end >= 0 else b""


def policy(path: str, body: bytes) -> str:
    """The Content-Security-Policy for one formgrader HTML page."""
    part = trusted_part(path, body)
    scripts = [m.group(2) for m in _INLINE_SCRIPT.finditer(part) if b"src=" not in m.group(1).lower()]
    handlers = [html.unescape((m.group(1) or m.group(2)).decode()).encode() for m in _HANDLER.finditer(part)]
    sources = ["'self'"] + (["'unsafe-hashes'"] if handlers else [])
    sources += sorted({_hash(s) for s in scripts + handlers})
    return f"script-src {' '.join(sources)}; {_FIXED}"


class PolicyTransform(OutputTransform):
    """Adds :func:`policy` to every HTML response under ``/formgrader/``."""

    def __init__(self, request: httputil.HTTPServerRequest) -> None:
        self.path = request.path

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders, chunk: bytes,
                              finishing: bool) -> tuple[int, httputil.HTTPHeaders, bytes]:
        if "/formgrader" not in self.path:
            return status_code, headers, chunk
        if status_code == 304:
            # A browser updates a cached page's headers from a 304; Jupyter's default policy, which allows
            # inline script, would replace the one computed for that page. Without it the page's own stays.
            headers.pop("Content-Security-Policy", None)
        elif headers.get("Content-Type", "").startswith("text/html"):
            # A page sent in pieces cannot be read whole here: it gets the policy with no inline script.
            headers["Content-Security-Policy"] = policy(self.path, chunk if finishing else b"")
            headers["Cache-Control"] = "no-store"   # grades and students' work: no copy on disk, no 304s
        return status_code, headers, chunk


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "autograder.formgrader_csp"}]


def _load_jupyter_server_extension(serverapp) -> None:  # noqa: ANN001 - jupyter_server's ServerApp
    # First, so it sees the page before any compressing transform.
    serverapp.web_app.transforms.insert(0, PolicyTransform)
    serverapp.log.info("formgrader's pages get a Content-Security-Policy (autograder.formgrader_csp)")

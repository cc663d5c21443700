"""Grading runtime shared by the autograder and the students' check command.

The grade is decided where the student's code cannot reach. Student code runs in a Jupyter kernel (in the
autograder, a sandboxed one); the tests run in the grader's own process and call the student's functions
across the process boundary, over a unix socket that carries plain values and tensors
(:mod:`agent_lab.grading.inkernel.wire`, never pickle). Whatever the kernel does, it can change only what
comes back from those calls, and the grader judges that with its own code.

Modules, in the order a grading run uses them:

* ``notebook``: read a submitted notebook as untrusted JSON and assemble the graded notebook from the
  instructor's release (only the sources of the student's own cells are taken from the submission);
* ``session``: start the kernel, run the student's cells (output caps, timeouts, restarts, replay);
* ``inkernel/`` (kernel side, :mod:`agent_lab.grading.inkernel`): the launcher and call server that the kernel
  starts before any student code, the wire format, the ``checks`` test cells use (the same in a student's
  notebook and in the grader) and the kernel's ``agent_lab/__init__.py``;
* ``remote`` (grader side): the student's functions as proxies, gradients through a custom autograd function;
* ``runner``: run each test cell in the grader's process and score it.

This package's ``__init__`` imports nothing: the kernel's view of ``agent_lab`` while grading contains only
this file and the folder ``inkernel/`` (see :func:`agent_lab.grading.inkernel.view_files`).
"""

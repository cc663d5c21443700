"""nbgrader configuration for the course's assignment source (course root: this folder).

`make assignments` (scripts/release_assignments.sh) runs `nbgrader generate_assignment` here: it strips the
solution regions and hidden tests from `source/<assignment>/` and writes the student version to
`release/<assignment>/` (built, git-ignored). The autograder keeps its own course copy under autograder/_work.
"""

import pathlib

from nbgrader.converters import GenerateAssignment

from agent_lab.book_links import BookLinks, book_url

c = get_config()  # noqa: F821  (provided by nbgrader when it loads this file)

HERE = pathlib.Path(__file__).resolve().parent

c.CourseDirectory.root = str(HERE)
c.CourseDirectory.course_id = "agent-lab"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
# The gradebook made while releasing lives in the course root (git-ignored); grading uses its own.
c.CourseDirectory.db_url = f"sqlite:///{HERE / 'gradebook.db'}"
# Only the notebook (and nothing built or cached) goes to students.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"
# Released notebooks carry no outputs.
c.ClearOutput.enabled = True
# Released notebooks link to the published book when html.baseurl (book/_config.yml) or AGENT_LAB_BOOK_URL says
# where it is (agent_lab.book_links); first, so that nbgrader's checksums are of the released text.
c.GenerateAssignment.preprocessors = [BookLinks, *GenerateAssignment.class_traits()["preprocessors"].default()]
c.BookLinks.base_url = book_url()

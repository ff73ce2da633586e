"""A module no setting names: a worker must never import it because a row says so."""

import os

from cairnq_django.compat import task

_marker = os.environ.get("CAIRNQ_UNDISCOVERED_MARKER")
if _marker:
    with open(_marker, "w") as marker:
        marker.write("imported\n")


@task
def side_effect():
    return "ran"

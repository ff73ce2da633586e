"""CairnQ options given to the decorator: Django 6.1+ and the backport only."""

from cairnq_django.compat import task


@task(cairnq_name="tests.decorated", max_attempts=4, conflict="reject")
def decorated():
    return "decorated"

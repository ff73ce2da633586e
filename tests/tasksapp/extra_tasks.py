"""A framework task found through the backend's OPTIONS["MODULES"], not an app."""

from cairnq_django.compat import task


@task
def multiply(a, b):
    return a * b

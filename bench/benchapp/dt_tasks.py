"""The django-tasks (django.tasks backport) no-op handler."""

from django_tasks import task

from .stamp import stamp


@task()
def noop(seq=None):
    stamp(seq)

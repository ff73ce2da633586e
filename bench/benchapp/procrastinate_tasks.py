"""The Procrastinate no-op handler."""

from procrastinate.contrib.django import app

from .stamp import stamp


@app.task(name="noop")
def noop(seq=None):
    stamp(seq)

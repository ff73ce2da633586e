"""Tasks of the demo app; the worker imports this module at start-up.

`send_email` is a CairnQ handler (a short name other languages can share);
`deliver_email` is the same job as a Tasks framework task (Django-native,
portable between backends). One `cairnq_worker` runs both. `count_slowly`
reports progress and stops when canceled; `flaky_fetch` fails twice and
succeeds on its third attempt, so the page shows progress, cancel and retry.
"""

import time

from django.core.mail import send_mail

import cairnq_django

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@cairnq_django.task
def send_email(ctx, payload):
    """Send one email through Django's mail API and report where it went."""
    sent = send_mail(
        subject=payload["subject"],
        message=payload["body"],
        from_email=None,  # DEFAULT_FROM_EMAIL
        recipient_list=[payload["to"]],
    )
    return {"sent": sent, "to": payload["to"]}


@task
def deliver_email(to, subject, body):
    """Send one email; enqueued with deliver_email.enqueue(to=..., subject=..., body=...)."""
    sent = send_mail(subject=subject, message=body, from_email=None, recipient_list=[to])
    return {"sent": sent, "to": to}


@cairnq_django.task
def count_slowly(ctx, payload):
    """Count to `steps`, one step a `pause` seconds, reporting progress; stop when canceled."""
    steps, pause = payload.get("steps", 30), payload.get("pause", 1.0)
    for step in range(1, steps + 1):
        if ctx.canceled():
            return None  # the task ends canceled, keeping its last progress and message
        time.sleep(pause)
        ctx.progress(step / steps, f"Counted {step} of {steps}.")
    return {"counted": steps}


@cairnq_django.task
def flaky_fetch(ctx, payload):
    """Fail (retryably) until attempt `succeed_on`, as a flaky upstream would."""
    succeed_on = payload.get("succeed_on", 3)
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"The upstream timed out (attempt {ctx.attempt}).")
    return {"fetched_on_attempt": ctx.attempt}

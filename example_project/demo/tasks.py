"""Tasks of the demo app; the worker imports this module at start-up.

`send_email` is a CairnQ handler (a short name other languages can share);
`deliver_email` is the same job as a Tasks framework task (Django-native,
portable between backends). One `cairnq_worker` runs both.
"""

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

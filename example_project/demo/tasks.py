"""Task handlers of the demo app; the worker imports this module at start-up."""

from django.core.mail import send_mail

import cairnq_django


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

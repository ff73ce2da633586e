"""The demo's own tests: `python manage.py test demo`.

They run the page's tasks in the test itself with cairnq_django.testing, no
worker needed: drain mode for the CairnQ handler, inline mode for the
framework task.
"""

from django.core import mail
from django.test import TestCase

import cairnq_django
from cairnq_django.testing import run_tasks

from .tasks import deliver_email

EMAIL = {"to": "reader@example.com", "subject": "Hi", "body": "Sent by the test."}


class QueueEmailTests(TestCase):
    def test_the_page_queues_an_email_that_drain_sends(self):
        tasks = self.enterContext(run_tasks())
        self.client.post("/", EMAIL)
        self.assertEqual(mail.outbox, [])  # queued, not sent: that is the worker's job

        [ran] = tasks.drain()

        self.assertEqual((ran.task.name, ran.status), ("send_email", "succeeded"))
        self.assertEqual([m.subject for m in mail.outbox], ["Hi"])

    def test_the_framework_task_runs_when_the_view_commits(self):
        self.enterContext(run_tasks(inline=True))
        self.client.post("/", {**EMAIL, "via": "framework"})

        self.assertEqual([m.to for m in mail.outbox], [["reader@example.com"]])
        [row] = cairnq_django.list_tasks(name="demo.tasks.deliver_email")
        result = deliver_email.get_result(row.id)
        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(result.return_value, {"sent": 1, "to": "reader@example.com"})

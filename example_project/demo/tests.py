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
        # The view enqueues in its atomic() block; inside the test's own
        # transaction the capture stands for its commit.
        with self.captureOnCommitCallbacks(execute=True):
            self.client.post("/", {**EMAIL, "via": "framework"})

        self.assertEqual([m.to for m in mail.outbox], [["reader@example.com"]])
        [row] = cairnq_django.list_tasks(name="demo.tasks.deliver_email")
        result = deliver_email.get_result(row.id)
        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(result.return_value, {"sent": 1, "to": "reader@example.com"})


class WatchableTaskTests(TestCase):
    def test_count_slowly_reports_its_progress(self):
        tasks = self.enterContext(run_tasks())
        task = cairnq_django.enqueue("count_slowly", {"steps": 3, "pause": 0})

        [ran] = tasks.drain()

        self.assertEqual((ran.status, ran.task.result), ("succeeded", {"counted": 3}))
        done = cairnq_django.get(task.id)
        self.assertEqual((done.progress, done.message), (1.0, "Counted 3 of 3."))

    def test_the_page_starts_a_long_task_and_cancels_it(self):
        self.enterContext(run_tasks())
        self.client.post("/start/long/")
        [task] = cairnq_django.list_tasks(name="count_slowly")
        self.assertEqual(task.status, "queued")
        self.assertContains(self.client.get("/tasks/"), f"/tasks/{task.id}/cancel/")

        self.client.post(f"/tasks/{task.id}/cancel/")

        self.assertEqual(cairnq_django.get(task.id).status, "canceled")
        self.assertContains(self.client.get("/tasks/"), f"/tasks/{task.id}/retry/")

    def test_flaky_fetch_succeeds_on_its_third_attempt(self):
        tasks = self.enterContext(run_tasks(retries=True))
        self.client.post("/start/flaky/")

        ran = tasks.drain()

        self.assertEqual([r.status for r in ran], ["queued", "queued", "succeeded"])
        self.assertEqual(ran[-1].task.result, {"fetched_on_attempt": 3})

    def test_a_failed_task_is_retried_from_the_page(self):
        tasks = self.enterContext(run_tasks())
        task = cairnq_django.enqueue("flaky_fetch", {"succeed_on": 2})
        [ran] = tasks.drain()  # retries off: the first failure is final
        self.assertEqual(ran.status, "failed")

        self.client.post(f"/tasks/{task.id}/retry/")
        [ran] = tasks.drain()

        self.assertEqual((ran.status, ran.task.attempt), ("succeeded", 2))

    def test_only_the_two_demo_tasks_can_be_started(self):
        self.assertEqual(self.client.post("/start/other/").status_code, 404)

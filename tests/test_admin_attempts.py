"""The task page's attempt timeline and current error (issue 32, item 4)."""

from __future__ import annotations

from django.contrib.admin.utils import quote
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cairnq_django.models import TaskAttempt

from .storeutil import expire_lease, run

CHANGELIST = "/admin/cairnq_django/task/"


def detail_url(task_id: str) -> str:
    return reverse("admin:cairnq_django_task_change", args=[quote(task_id)])


def fail_then_succeed(store, name: str, message: str, worker: str = "w1"):
    claimed = run(store, name, worker=worker)
    store.fail(claimed.id, worker, message, started_at_ms=claimed.updated_at_ms)
    again = store.claim(queues=["default"], worker_id="w2", names=[name])[0]
    return store.complete(again.id, "w2", {"ok": True})


def test_the_timeline_shows_each_attempt_escaped(admin_client, store):
    done = fail_then_succeed(store, "render", "<script>alert('x')</script>", worker="<b>w1</b>")

    html = admin_client.get(detail_url(done.id)).content.decode()

    assert '<table class="cq-attempts">' in html
    assert '<tr class="cq-attempt-retried"><td>1</td>' in html
    assert '<tr class="cq-attempt-succeeded"><td>2</td>' in html
    assert "<script>alert(" not in html and "<b>w1</b>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;w1&lt;/b&gt;" in html


def test_a_succeeded_task_shows_no_stale_error_as_its_state(admin_client, store):
    done = fail_then_succeed(store, "flaky", "first try broke")
    assert done.error is not None  # the protocol's row keeps it

    html = admin_client.get(detail_url(done.id)).content.decode()

    error_field = html.split("field-error_json", 1)[1].split("field-attempt_history", 1)[0]
    assert "first try broke" not in error_field
    assert "the task succeeded" in error_field
    # ...but the attempt it belongs to still shows it.
    assert "first try broke" in html.split("field-attempt_history", 1)[1]


def test_a_lost_attempt_and_a_task_without_attempts(admin_client, store):
    claimed = run(store, "crashy")
    expire_lease(store, claimed.id)
    store.claim(queues=["default"], worker_id="w2", names=["crashy"])
    html = admin_client.get(detail_url(claimed.id)).content.decode()
    assert '<tr class="cq-attempt-lost"><td>1</td>' in html
    assert '<tr class="cq-attempt-running"><td>2</td>' in html

    queued = store.submit("never_ran")
    html = admin_client.get(detail_url(queued.id)).content.decode()
    assert "cq-attempts" not in html


def test_the_changelist_reads_no_attempts(admin_client, store):
    def list_queries():
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(CHANGELIST).status_code == 200
        return queries

    fail_then_succeed(store, "one", "x")
    few = list_queries()
    for n in range(5):
        fail_then_succeed(store, f"more{n}", "y")
    many = list_queries()

    assert TaskAttempt.objects.count() == 6
    assert len(many) == len(few)
    assert not [q for q in many if "cairnq_django_task_attempt" in q["sql"]]


def test_the_admin_purge_takes_the_attempts_with_the_task(admin_client, store):
    done = fail_then_succeed(store, "purged", "x")
    assert TaskAttempt.objects.filter(task_id=done.id).count() == 1
    admin_client.post(
        CHANGELIST,
        {"action": "purge_tasks", "_selected_action": [done.id], "index": "0", "post": "yes"},
        follow=True,
    )
    assert store.get(done.id) is None
    assert not TaskAttempt.objects.filter(task_id=done.id).exists()


def test_a_task_a_peer_failed_shows_the_rows_error_as_its_last_attempt(admin_client, store):
    claimed = run(store, "peer_failed")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE cairnq_tasks SET status = 'failed', completed_at_ms = updated_at_ms,"
            " error = %s WHERE id = %s",
            ['{"type": "Peer", "code": "peer_<i>", "message": "from a peer", "retryable": false}',
             claimed.id],
        )
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(detail_url(claimed.id)).content.decode()
    timeline = html.split("field-attempt_history", 1)[1]
    assert '<tr class="cq-attempt-failed"><td>1</td>' in timeline
    assert "from a peer" in timeline and "peer_&lt;i&gt;" in timeline
    # The page never loads the model's deferred error column on its own.
    assert not [q for q in queries if q["sql"].lstrip().upper().startswith('SELECT "CAIRNQ_TASKS"."ERROR"')]

"""Settings for the test suite. CAIRNQ_TEST_DATABASE picks sqlite or postgres."""

import os
import tempfile

BACKEND = os.environ.get("CAIRNQ_TEST_DATABASE", "sqlite")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "cairnq_django",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"

# Child processes spawned by tests (workers, peers) must open the test database
# itself, not derive a fresh test name from NAME; conftest exports it here.
_child_db_name = os.environ.get("CAIRNQ_CHILD_DB_NAME")

if BACKEND == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _child_db_name or "cairnq",
            "USER": os.environ.get("PGUSER", "root"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": os.environ.get("CAIRNQ_PG_TEST_NAME", "test_cairnq_django")},
        }
    }
    # The same test database through the PgBouncer scripts/test starts
    # (transaction pooling; tests/test_pgbouncer.py). A mirror: no database of its own.
    # (The CairnQ store opens no server-side cursors, so none need disabling here.)
    if os.environ.get("CAIRNQ_PGBOUNCER_PORT"):
        DATABASES["bouncer"] = {
            **DATABASES["default"],
            "PORT": os.environ["CAIRNQ_PGBOUNCER_PORT"],
            "TEST": {"MIRROR": "default"},
        }
else:
    _test_file = os.environ.get(
        "CAIRNQ_SQLITE_TEST_FILE",
        os.path.join(tempfile.gettempdir(), f"cairnq_test_{os.getpid()}.sqlite3"),
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _child_db_name or os.path.join(tempfile.gettempdir(), "cairnq_unused.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            },
            # A file, not :memory:, so worker and peer processes can share it.
            "TEST": {"NAME": _test_file},
        }
    }

CAIRNQ: dict[str, object] = {}

# Django's Tasks framework on the CairnQ backend (tests/test_tasks_backend*.py).
# On Django 5.2 it comes from the django-tasks backport, whose app registers
# the framework's checks and signal receivers.
TASKS = {
    "default": {
        "BACKEND": "cairnq_django.backends.CairnQBackend",
        # Any queue name (the tests that need a list set their own).
        "QUEUES": [],
    }
}
try:
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:
        pass
    else:
        INSTALLED_APPS.append("django_tasks")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"cairnq_django": {"handlers": ["console"], "level": "WARNING"}},
}

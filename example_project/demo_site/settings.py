"""Settings for the cairnq_django demo, read from the environment.

DATABASE_URL picks the database (default: a SQLite file in example_project/db/),
e.g. DATABASE_URL=postgres://user@127.0.0.1:5432/demo for PostgreSQL.
"""

from datetime import timedelta
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="demo-only-not-a-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "cairnq_django",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DEFAULT_SQLITE_FILE = BASE_DIR / "db" / "demo.sqlite3"
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{DEFAULT_SQLITE_FILE}")}

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # What cairnq_django needs from SQLite (its system checks insist): write
    # transactions that take the lock up front, a generous busy timeout, and
    # WAL so the page can read while the worker writes.
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options.setdefault("transaction_mode", "IMMEDIATE")
    options.setdefault("timeout", 20)
    options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
    # SQLite creates the file but not its folder; a fresh clone has no db/.
    if DATABASES["default"]["NAME"] not in ("", ":memory:"):
        Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CAIRNQ = {
    # The demo's handlers send email; a handful of threads is plenty.
    "CONCURRENCY": 4,
    # Finished tasks are deleted after a while by `cairnq_worker --sweep`
    # (scripts/demo runs it so) or by `manage.py cairnq_sweep`.
    "RETENTION": {
        "succeeded": timedelta(days=1),
        "canceled": timedelta(days=1),
        "failed": timedelta(days=7),
    },
}

# Django's Tasks framework on the CairnQ tables: demo/tasks.py has one
# framework @task beside the CairnQ handler, and the same worker runs both.
# Django 6 has the framework built in; on Django 5.2 it is the django-tasks
# backport (pip install "cairnq-django[tasks]"), an app of its own.
TASKS = {"default": {"BACKEND": "cairnq_django.backends.CairnQBackend"}}
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

# Emails are printed by whichever process sends them: here, the worker.
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "demo@example.com"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"cairnq_django": {"handlers": ["console"], "level": "INFO"}},
}

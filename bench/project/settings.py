"""Django settings for one benchmark cell, chosen by BENCH_* environment variables.

BENCH_SYSTEM picks the installed apps (only the system under test), BENCH_BACKEND
the database engine and BENCH_DB its name (Postgres) or file path (SQLite).
"""

import os

SYSTEM = os.environ.get("BENCH_SYSTEM", "cairnq_django")
BACKEND = os.environ.get("BENCH_BACKEND", "sqlite")
DB = os.environ.get("BENCH_DB", "/tmp/cairnq_bench.sqlite3")

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = None

_apps = {
    "cairnq_django": ["cairnq_django"],
    "django_tasks_db": ["django_tasks", "django_tasks_db"],
    "procrastinate": ["procrastinate.contrib.django"],
    "django_q2": ["django_q"],
}
INSTALLED_APPS = [*_apps.get(SYSTEM, []), "bench.benchapp"]

if BACKEND == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB,
            "USER": os.environ.get("PGUSER", "root"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    }
else:
    # The configuration the cairnq_django docs recommend (and its system check
    # requires): BEGIN IMMEDIATE writes, WAL, synchronous=NORMAL. Every Django
    # system in the bench gets the same one.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            },
        }
    }

# Django's default (0: close after every request/task) unless the bench is
# asked to measure persistent connections.
if os.environ.get("BENCH_CONN_MAX_AGE"):
    _age = os.environ["BENCH_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "none" else int(_age)

# Measure psycopg server-side binding (prepared statements) when asked.
if BACKEND == "postgres" and os.environ.get("BENCH_SERVER_SIDE_BINDING"):
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True}

# Only for the system that uses it: cairnq_django runs the Tasks framework's
# checks, which refuse a django_tasks_db backend whose app is not installed.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}} if SYSTEM == "django_tasks_db" else {}
CAIRNQ = {}
# Compare fleets with every worker listening (BENCH_LISTENERS=none) or another seat count.
if os.environ.get("BENCH_LISTENERS"):
    _seats = os.environ["BENCH_LISTENERS"]
    CAIRNQ["LISTENERS"] = None if _seats == "none" else int(_seats)
# django-q2 with its Django ORM broker, at its defaults (workers = cores,
# polling the broker table every 0.2 s) unless a tuning sets BENCH_WORKERS.
Q_CLUSTER = {"name": "bench", "orm": "default", "timeout": 60, "retry": 120}
if os.environ.get("BENCH_WORKERS"):
    Q_CLUSTER["workers"] = int(os.environ["BENCH_WORKERS"])
PROCRASTINATE_IMPORT_PATHS = ["bench.benchapp.procrastinate_tasks"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

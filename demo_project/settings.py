"""Settings of the demo shop. Redis (broker and delay store) comes from ``REDIS_URL``."""

import os
import sys
import tempfile
from pathlib import Path

import django
from django.core.management.utils import get_random_secret_key

BASE_DIR = Path(__file__).resolve().parent
if str(BASE_DIR) not in sys.path:  # the demo app is importable as ``shop``
    sys.path.append(str(BASE_DIR))

# Only for this local demo: runserver on loopback, never deployed.
# Never in code: from the environment, else a random key for this process (the demo's
# sessions last as long as its server).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or get_random_secret_key()
DEBUG = os.environ.get("DEMO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_delayq.contrib.django",
    "shop",
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

ROOT_URLCONF = "demo_project.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

# Several processes write the demo's SQLite file: WAL, and transactions that wait for the
# write lock (sqlite_immediate does the same before Django 5.1).
_SQLITE_OPTIONS = {"timeout": 20}
_SQLITE_ENGINE = "demo_project.sqlite_immediate"
if django.VERSION >= (5, 1):
    _SQLITE_OPTIONS |= {"init_command": "PRAGMA journal_mode=WAL;",
                        "transaction_mode": "IMMEDIATE"}
    _SQLITE_ENGINE = "django.db.backends.sqlite3"
_DEFAULT_DB = BASE_DIR / ".data" / "db.sqlite3"
if "DEMO_DB" not in os.environ:
    _DEFAULT_DB.parent.mkdir(exist_ok=True)
DATABASES = {
    "default": {
        "ENGINE": _SQLITE_ENGINE,
        "NAME": os.environ.get("DEMO_DB", str(_DEFAULT_DB)),
        "OPTIONS": _SQLITE_OPTIONS,
        # a file, so a test's Celery worker threads and live server share it
        "TEST": {"NAME": os.path.join(tempfile.gettempdir(),
                                      f"delayq-test-{os.getpid()}.sqlite3")},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The delay store is on the broker's Redis (its default): no CELERY_DELAYQ_REDIS_URL, so a
# password in REDIS_URL stays masked where Celery shows the broker URL. A store elsewhere:
# CELERY_DELAYQ_REDIS_URL without the password, and CELERY_DELAYQ_REDIS_PASSWORD.
CELERY_DELAYQ_SHARDS = 4
CELERY_DELAYQ_IDLE_TIMEOUT = 2.0
DELAYQ_CELERY_APP = "demo_project.celery_app:app"
# The delayed-task admin links the business key "order:42" to order 42's admin page.
DELAYQ_KEY_MODELS = {"order": "shop.Order", "refund": "shop.Refund"}

# Demo timings: an unpaid order closes after SHOP_ORDER_TIMEOUT seconds; a refund's
# status is polled after each gap in turn (the last one repeats).
SHOP_ORDER_TIMEOUT = float(os.environ.get("SHOP_ORDER_TIMEOUT", "60"))
SHOP_REFUND_GAPS = [float(g) for g in
                    os.environ.get("SHOP_REFUND_GAPS", "10,30,120,300").split(",")]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"celery_delayq": {"handlers": ["console"], "level": "INFO"}},
}

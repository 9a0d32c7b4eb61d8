import os

SECRET_KEY = "paceline-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "django_site.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "paceline.django",
]
MIDDLEWARE = ["paceline.django.RateLimitMiddleware"]
DATABASES = {}
USE_TZ = True
PACELINE_STORAGE_URI = os.environ.get("PACELINE_TEST_STORAGE", "memory://")
PACELINE_LIMITS = ["20/second"]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": ["paceline.django.rest.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "10/hour", "user": "100/hour", "uploads": "2/hour"},
}

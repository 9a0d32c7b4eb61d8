"""With ``"paceline.django"`` in ``INSTALLED_APPS``, the settings are checked when Django
starts (a worker's boot, ``manage.py``), not at the first request: an unknown storage
scheme, unreadable rates in ``PACELINE_LIMITS`` or in DRF's ``DEFAULT_THROTTLE_RATES``
raise ``ImproperlyConfigured`` naming the text and what is accepted."""

from __future__ import annotations

from django.apps import AppConfig


class PacelineConfig(AppConfig):
    name = "paceline.django"
    label = "paceline"
    verbose_name = "paceline rate limits"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        from .._paceline import parse_rates
        from . import _limits_from_settings, storage

        try:
            storage()
            _limits_from_settings()
            framework = getattr(settings, "REST_FRAMEWORK", {}) or {}
            for scope, rate in (framework.get("DEFAULT_THROTTLE_RATES") or {}).items():
                if rate is not None:
                    try:
                        parse_rates(rate)
                    except (TypeError, ValueError) as e:
                        raise ValueError(f"DEFAULT_THROTTLE_RATES[{scope!r}]: {e}") from None
        except (TypeError, ValueError) as e:
            raise ImproperlyConfigured(f"paceline: {e}") from None

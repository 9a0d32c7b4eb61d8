"""A Django + DRF project limited by ``paceline.django``, for the tests: run by gunicorn
(``-w 4``) or by Django's and DRF's test clients. The storage comes from
``PACELINE_TEST_STORAGE``."""

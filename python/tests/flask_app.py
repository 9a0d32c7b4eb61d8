"""A Flask app limited by ``paceline.flask``, for the tests: run by gunicorn (``-w 4``)
or by Flask's test client. The storage comes from ``PACELINE_TEST_STORAGE``."""

import os

from flask import Blueprint, Flask, request

from paceline.flask import Limiter

app = Flask(__name__)
limiter = Limiter(
    app=app,
    default_limits=["20 per second"],
    storage_uri=os.environ.get("PACELINE_TEST_STORAGE", "memory://"),
    headers_enabled=True,
)


@app.route("/")
def home():
    return "ok"


@app.route("/login", methods=["POST"])
@limiter.limit("3 per hour", key_func=lambda: request.form.get("user", ""))
def login():
    return "welcome"


@app.route("/search")
@limiter.limit("5 per hour", cost=lambda: int(request.args.get("pages", 1)))
def search():
    return "results"


@app.route("/health")
@limiter.exempt
def health():
    return "healthy"


admin = Blueprint("admin", __name__)


@admin.route("/stats")
def stats():
    return "stats"


limiter.exempt(admin)
app.register_blueprint(admin, url_prefix="/admin")

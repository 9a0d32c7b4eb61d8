"""Limiter.shared in another local user's hands (this test run as root, the other user
`nobody` through setpriv, as CI does): a file another user planted is refused, a trusted
user's opened, and the service's own file can be neither opened nor taken over."""

import os
import subprocess
import sys

import pytest

import paceline


def _as_nobody(code, *args):
    """Runs Python `code` as the user nobody (root and setpriv needed); returns stdout."""
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _can_switch_user():
    import shutil

    if os.geteuid() == 0 and shutil.which("setpriv"):
        return True
    assert not os.environ.get("PACELINE_REQUIRE_OTHER_USER"), "needs root and setpriv"
    return False


def test_another_users_planted_file_is_refused_and_a_trusted_one_opened(request):
    request_cleanup = request.addfinalizer
    if not _can_switch_user():
        pytest.skip("needs root and setpriv to act as another user")
    import pathlib
    import shutil
    import tempfile

    # A directory like /dev/shm (pytest's own is private to its user).
    shm = pathlib.Path(tempfile.mkdtemp(prefix="paceline-shm-"))
    request_cleanup(lambda: shutil.rmtree(shm, ignore_errors=True))
    os.chmod(shm, 0o1777)
    planted = shm / "api"
    _as_nobody(
        "import os, sys; open(sys.argv[1], 'w').close(); os.chmod(sys.argv[1], 0o666)",
        str(planted),
    )
    with pytest.raises(PermissionError, match=r"uid 65534.*mode 0666.*chmod o-w"):
        paceline.Limiter.shared(str(planted), 10)
    # nobody's own private file: refused unless its user is trusted (by id or name).
    theirs = shm / "theirs"
    _as_nobody("import sys, paceline; paceline.Limiter.shared(sys.argv[1], 10)", str(theirs))
    with pytest.raises(PermissionError, match=r"another user owns it.*trust_user=65534"):
        paceline.Limiter.shared(str(theirs), 10)
    assert paceline.Limiter.shared(str(theirs), 10, trust_user="nobody").burst == 10
    assert planted.stat().st_size == 0 and planted.stat().st_uid == 65534
    # The service's own file: nobody can neither open it nor take it over.
    ours = shm / "ours"
    service = paceline.Limiter.shared(str(ours), 10, burst=10)
    said = _as_nobody(
        "import sys, paceline\n"
        "try:\n"
        "    paceline.Limiter.shared(sys.argv[1], 10**9, on_mismatch='replace')\n"
        "    print('opened')\n"
        "except PermissionError as e:\n"
        "    print('refused', e)\n",
        str(ours),
    )
    assert said.startswith("refused"), said
    assert sum(service.try_acquire() for _ in range(100)) == 10


def test_a_reset_by_root_keeps_another_users_file_theirs(request):
    if not _can_switch_user():
        pytest.skip("needs root and setpriv to act as another user")
    import pathlib
    import shutil
    import tempfile

    from paceline.asgi import Limit

    shm = pathlib.Path(tempfile.mkdtemp(prefix="paceline-shm-"))
    request.addfinalizer(lambda: shutil.rmtree(shm, ignore_errors=True))
    os.chmod(shm, 0o1777)
    path = str(shm / "limit")
    worker = ("import sys; from paceline.asgi import Limit; "
              "Limit('api', 2, per=3600.0, shared=sys.argv[1])")
    _as_nobody(worker, path)  # the workers' file, theirs
    before = os.stat(path)
    limit = Limit("api", 2, per=3600.0, shared=path, trust_user="nobody")
    limit.reset()
    after = os.stat(path)
    assert after.st_ino != before.st_ino  # made anew...
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    _as_nobody(worker, path)  # ...and its workers open it again

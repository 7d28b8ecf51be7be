"""glibc's malloc arenas capped for the commands and the test run (medrt.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from medrt import allocator

glibc_only = pytest.mark.skipif(allocator._glibc() is None, reason="not glibc: no mallopt or malloc_trim to call")


def _run(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter without MALLOC_ARENA_MAX unless given; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip()


@glibc_only
def test_the_test_run_caps_the_arenas_before_any_test_starts_a_thread():
    # conftest.py caps them at import, so a suite started any way stays bounded in memory
    assert os.environ.get("MALLOC_ARENA_MAX")


@glibc_only
def test_a_medrt_command_caps_the_arenas_for_itself_and_the_processes_it_starts():
    # --version: main caps them before it parses the arguments (argparse exits there)
    code = ("import os\nfrom medrt.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('MALLOC_ARENA_MAX'))")
    assert _run(code).splitlines()[-1] == str(allocator.DEFAULT_ARENAS)


@glibc_only
def test_an_operators_malloc_arena_max_wins():
    code = "import os\nfrom medrt import allocator\nprint(allocator.limit_arenas(), os.environ['MALLOC_ARENA_MAX'])"
    assert _run(code, MALLOC_ARENA_MAX="8") == "False 8"
    assert _run(code) == f"True {allocator.DEFAULT_ARENAS}"


def test_an_arena_count_below_one_is_refused():
    with pytest.raises(ValueError, match='"n"'):
        allocator.limit_arenas(0)


@glibc_only
def test_trim_calls_glibc():
    assert isinstance(allocator.trim(), bool)

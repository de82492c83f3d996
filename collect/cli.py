"""What every command does at its end: its exit status, and a Ctrl-C that is one line, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

RESUMES = "what finished is on disk: rerun the same command to resume"


def run_cli(main: Callable[[], object], on_interrupt: str = RESUMES, errors: tuple = ()) -> None:
    """sys.exit with `main()`'s status (an int; anything else is 0). Ctrl-C (SIGINT) prints one line saying what is
    kept, `on_interrupt`, and exits 130, the shell's code for it; an exception of `errors` (a user's mistake the
    message names, e.g. a missing input folder) prints `error: ...` and exits 2."""
    try:
        rc = main()
    except KeyboardInterrupt:
        print(f"\ninterrupted: {on_interrupt}", file=sys.stderr)
        sys.exit(130)
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)

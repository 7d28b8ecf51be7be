"""``python -m medrt_gui`` and the ``medrt-viewer`` GUI script: ``medrt view`` on its own."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from medrt.allocator import limit_arenas
    from medrt.commands.view import add_view_arguments, run
    from medrt.privacy import install_log_redaction

    limit_arenas()  # before Qt's and the pipeline's threads: as medrt.cli.main does

    parser = argparse.ArgumentParser(prog="medrt-viewer", description="medrt's desktop viewer (research use only).")
    add_view_arguments(parser)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no header values (names, dates) from pydicom/highdicom in the log
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

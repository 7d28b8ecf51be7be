"""The ``medrt`` command in the PyInstaller bundle (installer/medrt.spec)."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # the pipeline's worker processes start from this executable
    from medrt.cli import main

    sys.exit(main())

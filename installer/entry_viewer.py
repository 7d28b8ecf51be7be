"""The ``medrt-viewer`` program in the PyInstaller bundle (installer/medrt.spec)."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # the viewer decodes large files in worker processes
    from medrt_gui.__main__ import main

    sys.exit(main())

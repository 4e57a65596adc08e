"""``python -m tests.fuzz.atheris_main TARGET CORPUS [libFuzzer flags]``: one atheris run.

Started by ``python -m tests.fuzz`` in a child process: atheris (libFuzzer)
owns the process, exits on the first crash and writes the input to the
artifact prefix.  rsnotify is imported under atheris' instrumentation so the
fuzzer is guided by Python branch coverage of rsnotify, not of the harness.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["rsnotify"]):
    from tests.fuzz.targets import RAW_TARGETS


def main() -> None:
    target = RAW_TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

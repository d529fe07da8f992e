"""`python -m shigoto_operator [kopf run options]`: the operator, as the image runs it.

The same as `kopf run --all-namespaces -m shigoto_operator`, for environments where the `kopf`
script is not on PATH; extra arguments go to `kopf run` (e.g. `--standalone`, `--verbose`).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from kopf.cli import main as kopf_main

    args = ["run", "--all-namespaces", "-m", "shigoto_operator", *(argv or sys.argv[1:])]
    kopf_main(args=args, prog_name="python -m shigoto_operator")


if __name__ == "__main__":
    main()

"""``python -m fxquant``: the same as the ``fxquant`` command."""

from __future__ import annotations

from fxquant.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

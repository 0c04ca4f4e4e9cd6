"""python -m edgespec.engines.rowop setup | info: fetch the header where missing and build the library
(tools/setup.sh runs setup), or say which library, header and path this machine has."""

from __future__ import annotations

import subprocess
import sys

from edgespec.engines.rowop import build, native
from edgespec.engines.rowop.header import fetch_header


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "info"
    if what == "setup":
        try:
            if build.find_header() is None:
                fetch_header()
            lib = build.build_library(verbose=False)
            print(f"edgespec: row kernel built: {lib} (this CPU: {native.cpu_path() or native.unavailable()})")
        except (build.RowopUnavailable, OSError, subprocess.CalledProcessError) as e:
            print(f"edgespec: row kernel not built ({e}); the export will not offer it", file=sys.stderr)
            return 1
        return 0
    why = native.unavailable()
    print(f"header: {build.find_header()}\ncompiler: {build.find_compiler()}")
    print(f"library: {build._LIB.get('path')}\npath: {native.cpu_path() or '-'}{'  (' + why + ')' if why else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How faithful is a quantized folder to its fp32 export: top-1 agreement, KL and perplexity.

    python tools/quality.py --reference engines/fp32 engines/int4 engines/int8 --text FILE [FILE ...]

The same as `edgespec quality` (edgespec/runtime/apps/quality.py, which says what is measured);
kept for the command lines docs/results quote. A .gguf runs on llama.cpp (llama-cpp-python).
"""

from __future__ import annotations

import argparse
import sys

from edgespec.runtime.apps.quality import add_arguments, run_command


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

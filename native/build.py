"""Build the compiled PlainBuffer reader in place (``make native``), without the rest of the install.

The install (``pip install -e .``) builds it too; this rebuilds it after an edit of ``plainbuffer.c``
with the virtualenv's own setuptools (its build_ext, not a hand-written compiler command line).
"""

import sys
from pathlib import Path

from setuptools import Distribution

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from setup import PLAINBUFFER  # noqa: E402

PLAINBUFFER.optional = False  # asked for explicitly: a failed build is an error here
dist = Distribution({"name": "cdc-tunnel-native", "ext_modules": [PLAINBUFFER], "script_args": []})
command = dist.get_command_obj("build_ext")
command.inplace = True
dist.run_command("build_ext")

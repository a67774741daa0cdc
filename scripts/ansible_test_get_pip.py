# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in for the pip bootstrap script that ``ansible-test --venv`` downloads.

ansible-test fetches ``get-pip-<version>.py`` from a host that is not a package registry and is
not reachable here, unless the file is already in ``~/.ansible/test/cache/``.
scripts/sanity.sh puts this file there instead. It takes the same arguments as get-pip.py
(pip options, package specs, ``--no-setuptools``/``--no-wheel``), bootstraps pip with the
standard library's ``ensurepip``, then lets that pip install the requested packages (e.g.
``pip==24.2``) through the normal pip configuration, i.e. from PyPI.
"""

import ensurepip
import os
import subprocess
import sys


def main():
    args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
    env = dict(os.environ)  # ensurepip sets PIP_CONFIG_FILE=/dev/null in os.environ; keep pip's config
    ensurepip.bootstrap(upgrade=False)
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args, env=env))


if __name__ == "__main__":
    main()

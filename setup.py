"""Package discovery for the folder → namespace mapping (metadata lives in pyproject.toml).

``sw/`` → ``mcf``, ``hdl/`` → ``mcf.hdl``, ``sim/`` → ``mcf.sim``. Sub-packages are found by
walking the folders, so adding a folder with an ``__init__.py`` needs no edit here.
"""

from setuptools import find_packages, setup

ROOTS = {"mcf": "sw", "mcf.hdl": "hdl", "mcf.sim": "sim"}


def _packages():
    for prefix, folder in ROOTS.items():
        yield prefix
        for sub in find_packages(folder):
            yield f"{prefix}.{sub}"


setup(packages=sorted(_packages()), package_dir=ROOTS)

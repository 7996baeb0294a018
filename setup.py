"""The package layout, which pyproject.toml's static tables cannot compute: the installed namespace ``numcheck.*``
is this checkout's top-level folders, through ``package_dir`` (``numcheck.impls`` is the folder impls/), and the
packages are found in those folders, not listed by hand.

- ``numcheck``: the public API (numcheck/__init__.py, numcheck/errors.py).
- ``numcheck.<folder>`` for each of :data:`FOLDERS` and every package below it, except numcheck's own tests
  (tests/self) and the third-party adapters' tests (tests/adapters), which run from a checkout: of tests/ only the
  plugin (``numcheck.tests``) and the suite (``numcheck.tests.suite``) ship.

Everything else (metadata, dependencies, package data, entry points) is in pyproject.toml. An editable install
(``pip install -e .``) maps the same names onto the same folders: ``numcheck.impls.registry`` is impls/registry.py.
"""

from setuptools import find_packages, setup

#: The top-level folders that are numcheck's subpackages (numcheck/__init__.py's ``_SUBPACKAGES``).
FOLDERS: tuple[str, ...] = ("reference", "impls", "properties", "reports", "tests")
#: Packages below a folder that stay out of the wheel, by folder (patterns of :func:`setuptools.find_packages`).
LEFT_OUT: dict[str, tuple[str, ...]] = {"tests": ("self", "self.*", "adapters", "adapters.*")}

setup(
    package_dir={"numcheck": "numcheck", **{f"numcheck.{folder}": folder for folder in FOLDERS}},
    packages=[
        "numcheck",
        *(
            f"numcheck.{folder}{'.' + sub if sub else ''}"
            for folder in FOLDERS
            for sub in ("", *sorted(find_packages(where=folder, exclude=LEFT_OUT.get(folder, ()))))
        ),
    ],
)

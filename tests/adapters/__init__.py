if __name__ != "numcheck.tests.adapters":  # one copy of every module (see numcheck/tests/__init__.py)
    raise ImportError(
        f"{__name__!r} is numcheck's tests/adapters/ folder imported under the wrong name; import "
        f"numcheck.tests.adapters instead (install numcheck, e.g. `pip install -e .` in its checkout)"
    )

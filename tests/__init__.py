if __name__ != "numcheck.tests":  # one copy of every module: the folder tests/ is importable only as numcheck.tests
    raise ImportError(
        f"{__name__!r} is numcheck's tests/ folder imported under the wrong name; import "
        f"numcheck.tests instead (install numcheck, e.g. `pip install -e .` in its checkout)"
    )

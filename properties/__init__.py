"""The property library shared by the tests and the reports: problems, harness, tolerances, properties."""

if (
    __name__ != "numcheck.properties"
):  # one copy of every module: the folder properties/ is importable only as numcheck.properties
    raise ImportError(
        f"{__name__!r} is numcheck's properties/ folder imported under the wrong name; import "
        f"numcheck.properties instead (install numcheck, e.g. `pip install -e .` in its checkout)"
    )

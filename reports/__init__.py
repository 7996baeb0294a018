"""Report, checklist and command-line front ends built on :mod:`properties`."""

if (
    __name__ != "numcheck.reports"
):  # one copy of every module: the folder reports/ is importable only as numcheck.reports
    raise ImportError(
        f"{__name__!r} is numcheck's reports/ folder imported under the wrong name; import "
        f"numcheck.reports instead (install numcheck, e.g. `pip install -e .` in its checkout)"
    )

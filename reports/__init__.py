"""Report, checklist and command-line front ends built on :mod:`properties`."""

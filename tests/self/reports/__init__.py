"""Tests of the command line and the plugin (numcheck.reports, numcheck.tests.plugin)."""

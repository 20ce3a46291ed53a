"""The package version (read by setuptools at build time)."""

__version__ = "0.1.0"

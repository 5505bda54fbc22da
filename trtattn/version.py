"""The package version: a leaf, so that any module can name it without importing trtattn itself."""

__version__ = "0.1.0"

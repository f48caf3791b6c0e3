"""The version of the distribution, apart so the engine can name it without importing
the package that imports the engine."""

__version__ = "0.1.0"

"""Builds the optional C part of the reader (`flightdeck.readers.fr._rows`); pyproject.toml holds
the metadata. The extension is optional: without a compiler the install goes on and the reader
uses its Python pass (the same results, slower: flightdeck/readers/fr/signatures.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "flightdeck.readers.fr._rows",
            sources=["flightdeck/readers/fr/_rows.c"],
            optional=True,
        )
    ]
)

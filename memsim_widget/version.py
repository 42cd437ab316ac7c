"""The package version, in its own module so that what reports it (export provenance) need not import the
package face. Kept equal to pyproject.toml's ``version``."""

__version__ = "0.1.0"

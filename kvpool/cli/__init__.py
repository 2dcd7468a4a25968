"""The ``kvpool`` command: every argparse entry point of the project lives in this package."""

from .main import main

__all__ = ["main"]

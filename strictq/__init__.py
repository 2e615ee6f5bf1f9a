"""strictq: a strict queue with failure management. `strictq --help` lists the commands."""

__version__ = "0.1.0"

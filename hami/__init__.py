"""HAMi legacy-mode GPU sharing: the shared core (model, codecs, vendors, fitting, scoring, cluster state)."""

__version__ = "0.1.0"

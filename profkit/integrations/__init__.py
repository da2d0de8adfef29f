"""Optional integrations with web frameworks; each imports its framework only when imported.

* :mod:`profkit.integrations.fastapi`: ``instrument_app(app)`` makes every route handler of a
  FastAPI app a labelled root call.
"""

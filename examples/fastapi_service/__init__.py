"""A FastAPI inference service instrumented with profkit: ``app.py`` and its load script."""

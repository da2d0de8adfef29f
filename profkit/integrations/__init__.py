"""Optional integrations with web frameworks; each imports its framework only when imported.

* :mod:`profkit.integrations.fastapi`: ``instrument_app(app)`` makes every route handler of a
  FastAPI app a labelled root call.
* :mod:`profkit.integrations.ray_serve`: ``@replica`` configures and flushes profkit in
  every Ray Serve replica, ``traced(handle)`` carries a request's trace across a
  ``DeploymentHandle`` call, ``@batch`` makes ``@serve.batch`` batches profkit batches
  (``pip install 'profkit[ray]'``).
"""

"""Label: ``@profiled`` and ``region()``, the one scope behind both, the drivers of
coroutines and generators, and what a label does under ``torch.compile``.
"""

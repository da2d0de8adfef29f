"""Capture: the one decision for each root call, the owner of a window's life, the
process-wide slot, the window (one ``torch.profiler`` capture), the profiler and the hooks.
"""

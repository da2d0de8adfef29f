"""Runnable examples of profkit (see each module's docstring for its command)."""

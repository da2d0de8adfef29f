"""Targeting: slow-call capture (the latency book, speculation, the verdict) and the
trigger signal.
"""

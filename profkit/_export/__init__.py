"""Export: the bounded queue and its worker, one window to one summary, and the fan-out to
the span step and every exporter.
"""

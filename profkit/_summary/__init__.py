"""Summary: raw events (profkit's kineto reader), the builder of per-call trees and op rows,
torch.compile folding, the diagnosis and its thresholds (pure, no torch but the reader).
"""

"""Corpus-scale statistics: accumulators merged batch by batch, and the scan that drives them.

``rs.scan(model, corpus, stats=[...])`` traces the corpus one batch at a time, turns each
batch into sums, counts and top-k lists (``accumulators``), drops the batch, and can save
its state after every batch and resume from it. Several processes (``torchrun``) each scan
a share of the batches and merge their accumulators at the end (``distributed``).
"""

from .accumulators import STATS, Accumulator, make_accumulators
from .corpus import Corpus, corpus_batches
from .runner import ScanResult, scan

__all__ = ["STATS", "Accumulator", "Corpus", "ScanResult", "corpus_batches", "make_accumulators",
           "scan"]

"""Corpus-scale statistics: accumulators merged batch by batch, and the scan that drives them.

``rs.scan(model, corpus, stats=[...])`` runs the corpus through the model one batch at a
time, reduces each batch to sums, counts and top-k lists (``accumulators``; inside the
forward pass when it can, ``lean``), drops the batch, and can save its state after every
batch and resume from it. Several processes (``torchrun``) each scan a share of the batches
and merge their accumulators at the end (``runner``). A finished scan saved as ``.pt`` loads
back whole (``load_scan``, ``saved``).
"""

from .accumulators import STATS, Accumulator, SubspaceStats
from .batching import corpus_batches, row_batches
from .corpus import Corpus
from .ledger import Share
from .merging import merge_scans
from .runner import ScanResult, scan
from .saved import load_scan
from .specs import make_accumulators

__all__ = ["STATS", "Accumulator", "Corpus", "ScanResult", "Share", "SubspaceStats", "corpus_batches",
           "load_scan", "make_accumulators", "merge_scans", "row_batches", "scan"]

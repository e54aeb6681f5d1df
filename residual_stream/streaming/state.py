"""A scan's saved state: what it was run with, the sums so far and where to go on.

``save_state`` writes it atomically (a temporary file, flushed to disk, then renamed over the
last one); ``resume`` reads it back for a scan run with the same arguments (``scan_config``:
the model's name, shape, dtype and a fingerprint of its weights and of its tokenizer, the
statistics (in any order), batch
shape, budget, order, the corpus's fingerprint and segment size, the process's rank among
how many) and refuses one saved for others, by another version or unreadable, with what to
do; a file that is no scan state (a model checkpoint, another zip archive, no zip at all) is
refused as such, never with advice to delete it. It holds the name of the next batch
``(segment, index)``, the tokens and batches so far, every accumulator's ``state_dict`` and
the token counts of the segments counted (``ledger.Ledger``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import zipfile
from pathlib import Path

import torch

from ..errors import InputError
from ..files import look_up, writable
from .accumulators import Accumulator
from .corpus import Corpus
from .ledger import Ledger
from .tokenize import fingerprint as tokenizer_fingerprint

STATE_VERSION = 10  # 2: batches within segments, named (segment, index); 3: stats by spec, lens kl_sq;
# 4: batches by length (config "order"), growth's first-token sums, the lens's open texts;
# 5: a corpus of files fingerprinted by names, sizes and ends, not path and mtime;
# 6: a text longer than a segment cut into parts, each a segment (growth's massive "char");
#    the segments' token counts ("ledger"); 7: the model's shape, dtype and weights ("weights");
# 8: the tokenizer ("tokenizer"), the statistics in any order ("stats" sorted);
# 9: the weights' fingerprint over every value ("weights");
# 10: growth's norm histograms gain a bin of their own for norms of exactly 0 (column 0)


def scan_settings(model, corpus: Corpus, stats: list[str], batch_size: int, seq_len: int,
                  max_tokens: int | None, order: str, rank: int, world_size: int) -> dict:
    """What a scan is run with, but for the fingerprints of the weights and the tokenizer.

    A ``ScanResult``'s ``config`` (what ``merging`` checks); a state's with those added
    (``scan_config``).
    """
    a = model.anatomy
    return {"version": STATE_VERSION, "model": model.name, "stats": sorted(stats),
            "batch_size": batch_size, "shape": [a.n_layers, a.d_model, a.n_ctx],
            "dtype": str(model.dtype), "seq_len": seq_len, "max_tokens": max_tokens, "order": order,
            "corpus": corpus.fingerprint(), "segment_chars": corpus.segment_chars,
            "rank": rank, "world_size": world_size}


def scan_config(model, settings: dict) -> dict:
    """What a saved state must have been run with to be resumed (compared key by key).

    The scan's ``settings`` (``scan_settings``) and the fingerprints of its model's weights and
    tokenizer.
    """
    return {**settings, "weights": weights_fingerprint(model),
            "tokenizer": tokenizer_fingerprint(model.tokenizer)}


CHECKSUM_CHUNK = 1 << 20  # int16 values per dot product: |sum| < 2^15 · 2^15 · 2^20 = 2^50


@functools.lru_cache(maxsize=4)
def _position_weights(device: str) -> torch.Tensor:
    """``CHECKSUM_CHUNK`` fixed pseudo-random int16 weights, as float64 on ``device``."""
    g = torch.Generator().manual_seed(0x5EED)
    w = torch.randint(-(1 << 15), 1 << 15, (CHECKSUM_CHUNK,), generator=g, dtype=torch.int32)
    return w.double().to(device)


def _checksum(p: torch.Tensor) -> tuple[int, int]:
    """Exact sums of a parameter's bits read as int16: plain, and weighted by position.

    Position ``i`` weighs ``w[i mod CHECKSUM_CHUNK] · (i div CHECKSUM_CHUNK + 1)`` with ``w``
    fixed pseudo-random: a value edited anywhere, or two values swapped, changes the sum.
    Every partial sum is an integer below 2^53, so float64 adds them exactly in any order:
    the same weights give the same sums on any device and in any memory layout.
    """
    flat = p.detach().contiguous().view(-1)
    bits = flat.view(torch.int8 if flat.element_size() == 1 else torch.int16)
    if bits.device.type == "mps":  # no float64 there
        bits = bits.cpu()
    w = _position_weights(str(bits.device))
    total = weighted = 0
    for k, start in enumerate(range(0, bits.numel(), CHECKSUM_CHUNK)):
        chunk = bits[start:start + CHECKSUM_CHUNK].double()
        total += int(chunk.sum())
        weighted += (k + 1) * int(chunk @ w[:len(chunk)])
    return total, weighted


def weights_fingerprint(model) -> str:
    """A hash of every parameter's name, shape and exact checksums (``_checksum``), on its device.

    Models that share a name (twins of one shape, two fine-tunes of one base, one with a
    single weight edited) differ. Offloaded parameters (``meta``) are skipped. SmolLM2 on the
    2-core CPU: about 0.3 s.
    """
    h = hashlib.sha256()
    for name, p in model.module.named_parameters():
        if p.device.type != "meta":
            h.update(f"{name}{tuple(p.shape)}{_checksum(p)}".encode())
    return h.hexdigest()[:16]


NOT_A_STATE = "give --state a new file name (state= in Python), or a state a scan saved"
FIELDS = {"next": list, "tokens": int, "batches": int, "stats": dict, "ledger": list}  # and "config"


def _load_state(path: Path, config: dict) -> dict | None:
    if look_up(path, "the scan state") is None:
        return None
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # not what torch.save writes: maybe a file given by mistake
            raise InputError(f"{path} is not a scan state (not a file torch.save wrote); {NOT_A_STATE}")
    try:  # torch.load does not check the records' CRCs: a flipped bit would load as a wrong sum
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            bad = archive.testzip()
    except Exception as e:  # noqa: BLE001 - cut short, or a record unreadable: the same advice
        raise _damaged(path, e) from None
    if not any(n.endswith("/data.pkl") for n in names):  # an archive torch.save did not write
        raise InputError(f"{path} is not a scan state (a zip archive, not a file torch.save "
                         f"wrote); {NOT_A_STATE}")
    if bad is not None:
        raise _damaged(path, zipfile.BadZipFile(f"CRC of {bad}"))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - its records are whole: it holds what a state never does
        raise InputError(f"{path} is not a scan state (it holds more than a state's plain data: "
                         f"{type(e).__name__}: {str(e).split('. ')[0][:120]}); {NOT_A_STATE}") from None
    saved = state.get("config") if isinstance(state, dict) else None
    if not (isinstance(saved, dict) and "version" in saved):  # a checkpoint, a tensor, a list
        keys = sorted(map(str, state)) if isinstance(state, dict) else []
        what = f"a dict of {len(keys)} entries ({', '.join(keys[:3])}{', …' if keys[3:] else ''})" \
            if isinstance(state, dict) else f"a {type(state).__name__}"
        raise InputError(f"{path} is not a scan state (torch.save wrote {what}, without a scan's "
                         f"config); {NOT_A_STATE}")
    if saved["version"] != config["version"]:
        raise InputError(f"the scan state {path} was saved by another version of residual-stream "
                         f"(state version {saved['version']}, this one reads {config['version']}); "
                         "delete it to start the scan again, or give another state path (--state)")
    if saved != config:
        diff = {k: (saved.get(k), v) for k, v in config.items() if saved.get(k) != v}
        raise InputError(f"the scan state {path} was saved for other arguments {diff} (saved, now); "
                         "use the same arguments to resume, or give another state path (--state)")
    _check_fields(path, state)
    return state


def _damaged(path: Path, e: Exception) -> InputError:
    """The error for a state file that cannot be read whole: cut short, a flipped bit."""
    return InputError(f"the scan state {path} is damaged ({type(e).__name__}: {e}); delete it "
                      "to start the scan again")


def _check_fields(path: Path, state: dict) -> None:
    """``InputError`` unless ``state`` holds ``FIELDS``, each of its type, ``next`` two counts."""
    wrong = [k for k, kind in FIELDS.items()
             if not isinstance(state.get(k), kind) or isinstance(state.get(k), bool)]
    if not wrong:
        counts = [*state["next"], state["tokens"], state["batches"], *state["ledger"]]
        wrong = [] if len(state["next"]) == 2 and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) else ["next"]
    if wrong:
        raise InputError(f"the scan state {path} is damaged: its {wrong[0]!r} is missing or not "
                         "as a scan saves it; delete it to start the scan again")


def resume(path: Path | None, config: dict | None,
           accs: dict[str, Accumulator]) -> tuple[tuple[int, int], int, int, Ledger]:
    """The next batch, tokens, batches and ledger a saved state holds; its sums put in ``accs``.

    ``InputError`` first when ``path`` cannot be written (a folder, a missing or read-only
    folder above it): the scan would end without its state. A state whose sums do not load
    is refused before any is put in ``accs``.
    """
    if path is not None:
        writable(path)  # before any batch: the first save may be the scan's last moment
    saved = _load_state(path, config) if path is not None else None
    if saved is None:
        return (0, 0), 0, 0, Ledger()
    for name, acc in accs.items():  # each into an empty copy first: all or none into accs
        try:
            acc.empty_like().load_state_dict(saved["stats"][name])
        except Exception as e:  # noqa: BLE001 - a missing statistic, a wrong shape or type
            raise _damaged(path, e) from None
    for name, acc in accs.items():
        acc.load_state_dict(saved["stats"][name])
    return tuple(saved["next"]), saved["tokens"], saved["batches"], Ledger(saved["ledger"])


def save_state(path: Path, config: dict, done: tuple[int, int], tokens: int, batches: int,
               accs: dict[str, Accumulator], ledger: Ledger) -> None:
    """Write the state atomically: ``done`` is the next batch, ``tokens`` and ``batches`` so far."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with open(tmp, "wb") as f:
            torch.save({"config": config, "next": list(done), "tokens": tokens, "batches": batches,
                        "stats": {n: a.state_dict() for n, a in accs.items()},
                        "ledger": list(ledger.counts)}, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the state
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

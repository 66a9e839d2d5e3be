"""The validator's state on disk: scoring state + θ + bookkeeping, saved together after every window.

Each save writes a new folder ``w{model_window}/`` (scoring.json, model.safetensors
— θ and the outer optimiser's state, ``outer.*`` — meta.json), then atomically
repoints ``current`` at it, then prunes old folders.
A validator killed at any moment restarts from the last complete window — the
same state it had in memory — so it posts the weights it would have posted
without the restart.  A folder that is damaged or of an earlier state version is
skipped (logged) and the next newest tried; with none left the validator starts
clean (docs/protocol.md, "The validator's own state").
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dso.config.schema import HParams
from dso.nn.model import model_hash
from dso.training.outer import STATE_PREFIX, OuterState
from dso.training.outer_rules import OuterRule
from dso.util.atomic import atomic_write
from neurons.persist import load_json, load_tensors, save_json, save_tensors
from scoring import state as scoring_state
from scoring.history import UploadHistory
from storage import keys

KEEP = 3  # folders kept (the newest is current)
log = logging.getLogger("dso.validator")


@dataclass
class Bookkeeping:
    model_window: int                                   # the model is θ_{model_window}
    lists: dict[int, list[int]] = field(default_factory=dict)  # top-G list in effect per window
    ledger_hash: str = ""                               # hash of the last provenance record
    run: str = ""                                       # the network run this state belongs to
    outer: OuterState = field(default_factory=OuterState)  # the outer step's state at model_window (not JSON)

    def to_json(self, model_digest: str) -> dict[str, Any]:
        return {"model_window": self.model_window, "model_hash": model_digest, "ledger_hash": self.ledger_hash,
                "lists": {str(t): uids for t, uids in sorted(self.lists.items())}, "run": self.run}


def save(root: Path, scores: scoring_state.ValidatorState, model: torch.nn.Module, book: Bookkeeping) -> None:
    folder = root / f"w{book.model_window}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    scores.save(folder / "scoring.json")
    save_tensors(folder / "history.safetensors", scores.history.to_tensors())
    save_tensors(folder / "model.safetensors", {n: p.detach().cpu() for n, p in model.named_parameters()}
                 | book.outer.tensors())
    save_json(folder / "meta.json", book.to_json(model_hash(model)) | {"outer_digest": book.outer.digest()})
    atomic_write(root / "current", folder.name.encode())
    for old in sorted(root.glob("w*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)[:-KEEP]:
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def _folders(root: Path) -> list[Path]:
    """Saved folders to try, best first: the one ``current`` names, then the others newest first."""
    try:
        named = (root / "current").read_text().strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    numbered = sorted((p for p in root.glob("w*") if p.name[1:].isdigit() and p.is_dir()),
                      key=lambda p: int(p.name[1:]), reverse=True)
    first = [root / named] if named and (root / named) in numbered else []
    return first + [p for p in numbered if p not in first]


def load_folder(folder: Path, model: torch.nn.Module, run_digest: str,
                rule: HParams | OuterRule | None = None) -> tuple[scoring_state.ValidatorState, Bookkeeping]:
    """One saved folder, loaded into ``model``; raises StateError naming the file and the problem (the
    model is left as it was when it does).  ``rule``: the run's outer rule, whose state the folder must hold
    (None: whichever it holds)."""
    scores = scoring_state.load(folder / "scoring.json", run_digest)
    scores.history = _history(folder / "history.safetensors")
    meta = load_json(folder / "meta.json")
    if meta is None:
        raise scoring_state.StateError(f"{folder}/meta.json missing or unreadable")
    tensors = load_tensors(folder / "model.safetensors")
    names = {n: p for n, p in model.named_parameters()}
    if tensors is None:
        raise scoring_state.StateError(f"{folder}/model.safetensors missing or unreadable")
    shapes = {n: tuple(p.shape) for n, p in names.items()}
    outer = OuterState.from_tensors({k: t for k, t in tensors.items() if k.startswith(STATE_PREFIX)}, shapes, rule)
    if outer is None or outer.digest() != meta.get("outer_digest"):
        raise scoring_state.StateError(f"{folder}/model.safetensors: no valid outer state for the run's outer "
                                       "rule matching meta.json")
    tensors = {k: t for k, t in tensors.items() if not k.startswith(STATE_PREFIX)}
    bad = [n for n, p in names.items() if n not in tensors or tensors[n].shape != p.shape]
    if bad or set(tensors) != set(names):
        raise scoring_state.StateError(f"{folder}/model.safetensors does not hold this model's parameters "
                                       f"({(bad or sorted(set(tensors) - set(names)))[:3]})")
    try:
        book = Bookkeeping(_int(meta["model_window"]), {_int(t): [_int(u) for u in uids]
                                                        for t, uids in meta["lists"].items()},
                           str(meta.get("ledger_hash", "")), str(meta["run"]), outer)
        if not keys.is_run_id(book.run):
            raise ValueError(f"run {book.run[:32]!r} is not a run id")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise scoring_state.StateError(f"{folder}/meta.json: {type(e).__name__}: {str(e)[:200]}") from None
    before = {n: p.detach().clone() for n, p in names.items()}
    with torch.no_grad():
        for name, p in names.items():
            p.copy_(tensors[name].to(p.device, p.dtype))
        if model_hash(model) != meta.get("model_hash"):
            for name, p in names.items():
                p.copy_(before[name])
            raise scoring_state.StateError(f"{folder}/model.safetensors does not match the hash in meta.json")
    return scores, book


def _history(path: Path) -> UploadHistory:
    """The saved history of uploads (scoring/history.py); raises StateError when it is damaged."""
    tensors = load_tensors(path)
    if tensors is None:
        raise scoring_state.StateError(f"{path} missing or unreadable")
    try:
        return UploadHistory.from_tensors(tensors)
    except ValueError as e:
        raise scoring_state.StateError(f"{path}: {e}") from None


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not -1 <= int(value) <= 2 ** 53:
        raise ValueError(f"{str(value)[:24]!r} is not a window or uid")
    return int(value)


def load(root: Path, model: torch.nn.Module, run_digest: str, rule: HParams | OuterRule | None = None
         ) -> tuple[scoring_state.ValidatorState, Bookkeeping] | None:
    """The newest save that loads cleanly, loaded into ``model``; None when there is none (start clean).

    A folder that is damaged or was written by an earlier state version is skipped, with a warning naming
    it and why, and the next newest is tried: the validator resumes from its last good save, or from a
    clean state, instead of stopping.  A valid save of *another run* (other settings) still raises
    :class:`~scoring.state.ForeignRunError`: that is an operator's mistake, and starting over would prune
    those folders."""
    skipped = 0
    for folder in _folders(root):
        try:
            loaded = load_folder(folder, model, run_digest, rule)
        except scoring_state.ForeignRunError:
            raise
        except scoring_state.StateError as e:
            log.warning("validator state: skipping saved folder %s: %s", folder, e)
            skipped += 1
            continue
        if skipped:
            log.warning("validator state: resuming from %s, the newest save that loads (%d newer skipped)",
                        folder, skipped)
        return loaded
    if skipped:
        log.warning("validator state: no saved folder under %s loads; starting from a clean state", root)
    return None

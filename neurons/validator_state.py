"""The validator's state on disk: scoring state + θ + bookkeeping, saved together after every window.

Each save writes a new folder ``w{model_window}/`` (scoring.json, model.safetensors,
meta.json), then atomically repoints ``current`` at it, then prunes old folders.
A validator killed at any moment restarts from the last complete window — the
same state it had in memory — so it posts the weights it would have posted
without the restart.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dso.model import model_hash
from dso.atomic import atomic_write
from neurons.persist import load_json, load_tensors, save_json, save_tensors
from scoring import state as scoring_state
from storage import keys

KEEP = 3  # folders kept (the newest is current)


@dataclass
class Bookkeeping:
    model_window: int                                   # the model is θ_{model_window}
    lists: dict[int, list[int]] = field(default_factory=dict)  # top-G list in effect per window
    ledger_hash: str = ""                               # hash of the last provenance record
    run: str = ""                                       # the network run this state belongs to

    def to_json(self, model_digest: str) -> dict:
        return {"model_window": self.model_window, "model_hash": model_digest, "ledger_hash": self.ledger_hash,
                "lists": {str(t): uids for t, uids in sorted(self.lists.items())}, "run": self.run}


def save(root: Path, scores: scoring_state.ValidatorState, model: torch.nn.Module, book: Bookkeeping) -> None:
    folder = root / f"w{book.model_window}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    scores.save(folder / "scoring.json")
    save_tensors(folder / "model.safetensors", {n: p.detach().cpu() for n, p in model.named_parameters()})
    save_json(folder / "meta.json", book.to_json(model_hash(model)))
    atomic_write(root / "current", folder.name.encode())
    for old in sorted(root.glob("w*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)[:-KEEP]:
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def load(root: Path, model: torch.nn.Module, run_digest: str
         ) -> tuple[scoring_state.ValidatorState, Bookkeeping] | None:
    """The last complete save, loaded into ``model``; None when there is none.  A save that does not fit
    this run (other settings, corrupt files, wrong model hash) raises StateError naming the file."""
    try:
        folder = root / (root / "current").read_text().strip()
    except OSError:
        return None
    scores = scoring_state.load(folder / "scoring.json", run_digest)
    meta = load_json(folder / "meta.json")
    tensors = load_tensors(folder / "model.safetensors")
    names = [n for n, _ in model.named_parameters()]
    if meta is None or tensors is None or set(tensors) != set(names):
        raise scoring_state.StateError(f"{folder}: meta.json or model.safetensors missing or unreadable")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].to(p.device))
    if model_hash(model) != meta.get("model_hash"):
        raise scoring_state.StateError(f"{folder}/model.safetensors does not match the hash in meta.json")
    try:
        book = Bookkeeping(int(meta["model_window"]), {int(t): [int(u) for u in uids]
                                                       for t, uids in meta["lists"].items()},
                           str(meta.get("ledger_hash", "")), str(meta["run"]))
        if not keys.is_run_id(book.run):
            raise ValueError(f"run {book.run[:32]!r} is not a run id")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise scoring_state.StateError(f"{folder}/meta.json: {e}") from None
    return scores, book

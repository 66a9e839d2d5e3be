"""Gauntlet scoring (design §6): per-peer state, evaluation, ratings, weights.  See docs/scoring.md."""
from scoring.state import PeerState, StateError, ValidatorState, load, load_or_new
from scoring.sync import sample_parameters, sync_positions
from scoring.window import WindowAlreadyScored, WindowReport, plan_fast_set, score_window

__all__ = ["PeerState", "StateError", "ValidatorState", "WindowAlreadyScored", "WindowReport", "load",
           "load_or_new", "plan_fast_set", "sample_parameters", "score_window", "sync_positions"]

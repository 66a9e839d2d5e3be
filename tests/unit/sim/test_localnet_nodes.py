"""What a local network's node runs, from its behaviour's class (sim/localnet.py): the production entry points for
the honest work, the experiment's miner or validator for the rest, a larger CPU share for more compute."""
from sim.localnet import DILIGENT_NICE, MINER_NICE, ROOT, NodeSpec, node_nice


def test_honest_work_runs_the_production_entry_points():
    assert NodeSpec("miner0", "miner").program == [str(ROOT / "neurons" / "miner.py")]
    assert NodeSpec("diligent0", "miner", behaviour="diligent").program == [str(ROOT / "neurons" / "miner.py")]
    assert NodeSpec("validator0", "validator").program == [str(ROOT / "neurons" / "validator.py")]


def test_other_behaviours_run_the_experiments_programs():
    assert NodeSpec("copier0", "miner", behaviour="copier").program == ["-m", "sim.miner", "--behaviour", "copier"]
    assert NodeSpec("v1", "validator", behaviour="lying_leader").program == [
        "-m", "sim.validator", "--behaviour", "lying_leader"]
    # an unknown name goes to the experiment's program, which refuses it with the known ones
    assert NodeSpec("x0", "miner", behaviour="nosuch").program[:2] == ["-m", "sim.miner"]


def test_more_compute_and_lateness_come_from_the_behaviours_plan():
    diligent, late, hider = (NodeSpec(b, "miner", behaviour=b) for b in ("diligent", "late", "hider"))
    assert diligent.plan is not None and diligent.plan.data_batches == 2
    assert late.plan is not None and late.plan.late and hider.plan is not None and hider.plan.late
    assert NodeSpec("v1", "validator", behaviour="lying_leader").plan is None
    assert node_nice(diligent) == DILIGENT_NICE < node_nice(late) == node_nice(NodeSpec("m", "miner")) == MINER_NICE
    assert node_nice(NodeSpec("validator0", "validator")) == 0

"""Clip + Gaussian noise and the Rényi-DP accountant."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dso.config.schema import DPConfig
from dso.privacy.dp import (
    PrivacyStateError,
    RdpAccountant,
    clip_and_noise,
    dp_settings,
    gaussian_rdp,
    global_norm,
    noise_for_target,
    rdp_to_epsilon,
)
from dso.protocol.rejections import Reason

torch.set_num_threads(1)


def oracle_epsilon(z: float, rounds: int, delta: float, orders=range(2, 128)) -> tuple[float, int]:
    """Independent numpy evaluation of the Balle et al. (2020) conversion over the same orders, for the
    Gaussian mechanism with sensitivity 2C (replace-one neighbours) and noise std zC: RDP = α·2²/(2z²)."""
    a = np.array(list(orders), dtype=float)
    eps = rounds * a * 4 / (2 * z * z) + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
    i = int(np.argmin(eps))
    return float(eps[i]), int(a[i])


def dp_accounting_epsilon(z: float, rounds: int, delta: float, orders=range(2, 128)) -> tuple[float, int]:
    """Google's dp-accounting (PyPI): the Gaussian mechanism with sensitivity 2C and std zC is its
    GaussianDpEvent with noise multiplier z/2 (its multiplier is relative to the query's sensitivity)."""
    dpa = pytest.importorskip("dp_accounting", reason="dp-accounting (test extra) is not installed")
    from dp_accounting import rdp
    accountant = rdp.RdpAccountant(list(orders))
    accountant.compose(dpa.GaussianDpEvent(z / 2), rounds)
    eps, order = accountant.get_epsilon_and_optimal_order(delta)
    return float(eps), int(order)


@pytest.mark.parametrize("z,rounds,epsilon,order", [(1.0, 1, 11.855, 4), (2.0, 100, 112.429, 2)])
def test_known_epsilon_against_dp_accounting(z, rounds, epsilon, order):
    """The issue's figures: a miner clips its whole update to C, so two real inputs differ by 2C."""
    acc = RdpAccountant(z, 1e-6)
    acc.step(rounds)
    eps, got_order = acc.epsilon()
    assert eps == pytest.approx(epsilon, abs=5e-3) and got_order == order
    assert (eps, got_order) == pytest.approx(dp_accounting_epsilon(z, rounds, 1e-6), rel=1e-9)
    assert (eps, got_order) == pytest.approx(oracle_epsilon(z, rounds, 1e-6), rel=1e-12)


def test_known_epsilon_one_round_z1_by_hand():
    acc = RdpAccountant(1.0, 1e-6)
    acc.step()
    # at α = 4: RDP = 2α/z² = 8, + ln(3/4) − (ln 1e-6 + ln 4)/3
    assert acc.epsilon()[0] == pytest.approx(8 + math.log(3 / 4) - (math.log(1e-6) + math.log(4)) / 3, rel=1e-12)
    # the old figure (sensitivity C) is what the add/remove relation would give: 5.2224 at order 6
    assert rdp_to_epsilon(gaussian_rdp(range(2, 128), 1.0, sensitivity=1.0), range(2, 128), 1e-6) == \
        pytest.approx((5.2224, 6), abs=5e-5)


@pytest.mark.parametrize("z,rounds,delta", [(0.8, 3, 1e-5), (1.5, 40, 1e-6), (5.0, 1000, 1e-8)])
def test_epsilon_matches_oracle(z, rounds, delta):
    acc = RdpAccountant(z, delta)
    for _ in range(rounds):
        acc.step()
    assert acc.epsilon() == pytest.approx(oracle_epsilon(z, rounds, delta), rel=1e-9)
    assert acc.rounds == rounds


def test_rdp_is_linear_and_epsilon_grows_with_rounds():
    assert gaussian_rdp([2, 10], 2.0) == [1.0, 5.0]                        # 2α/z²
    assert gaussian_rdp([2, 10], 2.0, sensitivity=1.0) == [0.25, 1.25]
    acc = RdpAccountant(1.0)
    assert acc.epsilon() == (0.0, None)  # nothing spent yet
    previous = 0.0
    for _ in range(5):
        after = acc.epsilon_after(1)[0]
        acc.step()
        assert acc.epsilon()[0] == pytest.approx(after) and after > previous
        previous = after


def test_would_exceed_and_budget_rejection():
    acc = RdpAccountant(1.0, 1e-6)
    budget = 10.0
    rounds = 0
    while not acc.would_exceed(budget):
        assert acc.budget_rejection(budget) is None
        acc.step()
        rounds += 1
    assert acc.epsilon()[0] <= budget < acc.epsilon_after(1)[0]
    # the number of rounds agrees with the oracle
    assert oracle_epsilon(1.0, rounds, 1e-6)[0] <= budget < oracle_epsilon(1.0, rounds + 1, 1e-6)[0]
    rejection = acc.budget_rejection(budget)
    assert rejection.reason is Reason.DP_BUDGET and "budget" in rejection.detail


def test_state_survives_restart(tmp_path):
    path = tmp_path / "dp" / "accountant.json"
    acc = RdpAccountant.from_config(DPConfig(noise_multiplier=1.3, delta=1e-6, max_order=64, target_epsilon=0))
    acc.step(7)
    acc.save(path)
    again = RdpAccountant.load(path)
    assert again.epsilon() == acc.epsilon() and again.rounds == 7 and again.orders == list(range(2, 65))
    resumed = RdpAccountant.load_or_create(path, 2.0, 1e-5, range(2, 65))  # new z applies to future rounds
    assert resumed.rdp == acc.rdp and resumed.noise_multiplier == 2.0 and resumed.delta == 1e-5
    fresh = RdpAccountant.load_or_create(tmp_path / "none.json", 1.0, 1e-6, range(2, 65))
    assert fresh.rounds == 0
    assert not list(path.parent.glob("*.tmp"))  # the atomic write left no temporary behind
    with pytest.raises(PrivacyStateError, match="orders"):
        RdpAccountant.load_or_create(path, 1.0, 1e-6, range(2, 128))


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("rdp"),
    lambda d: d.update(rdp=d["rdp"][:-1]),
    lambda d: d.update(rdp=[-1.0] * len(d["orders"])),
    lambda d: d.update(rounds=-2),
    lambda d: d.update(rounds=True),
    lambda d: d.update(format="other"),
    lambda d: d.update(noise_multiplier="1.0"),
    lambda d: d.update(extra=1),
    lambda d: d.update(orders=[1] + d["orders"][1:]),
])
def test_load_is_strict(tmp_path, mutate):
    path = tmp_path / "acc.json"
    acc = RdpAccountant(1.0, orders=range(2, 10))
    acc.step(2)
    acc.save(path)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(PrivacyStateError):
        RdpAccountant.load(path)


def test_load_rejects_garbage_and_nan(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text("{not json")
    with pytest.raises(PrivacyStateError):
        RdpAccountant.load(path)
    acc = RdpAccountant(1.0, orders=range(2, 4))
    acc.save(path)
    path.write_text(path.read_text().replace("0.0", "NaN", 1))
    with pytest.raises(PrivacyStateError):
        RdpAccountant.load(path)
    with pytest.raises(PrivacyStateError):
        RdpAccountant.load(tmp_path / "missing.json")


def test_clip_scales_the_whole_update_to_the_clip_norm():
    gen = torch.Generator().manual_seed(0)
    update = {"a": torch.full((3, 4), 2.0), "b": torch.full((5,), -1.0)}
    norm = math.sqrt(12 * 4 + 5)
    assert global_norm(update) == pytest.approx(norm)
    out = clip_and_noise(update, clip_norm=1.0, noise_multiplier=0.0, generator=gen)
    assert global_norm(out) == pytest.approx(1.0, rel=1e-6)
    assert torch.allclose(out["a"], update["a"] / norm) and torch.allclose(out["b"], update["b"] / norm)
    small = {"a": torch.full((2,), 0.1)}
    assert torch.equal(clip_and_noise(small, 1.0, 0.0, gen)["a"], small["a"])  # below the clip: unchanged
    assert list(clip_and_noise({"z": torch.ones(1), "a": torch.ones(1)}, 1.0, 0.0, gen)) == ["z", "a"]


def test_noise_has_the_calibrated_std_and_is_reproducible():
    update = {"w": torch.zeros(200, 100), "b": torch.zeros(1000)}
    out = clip_and_noise(update, clip_norm=0.5, noise_multiplier=1.2, generator=torch.Generator().manual_seed(3))
    samples = torch.cat([t.reshape(-1) for t in out.values()]).double().numpy()
    # std should be z·C = 0.6: a Kolmogorov–Smirnov test against N(0, 0.6²)
    assert stats.kstest(samples, "norm", args=(0.0, 0.6)).pvalue > 1e-3
    assert samples.std() == pytest.approx(0.6, rel=0.02)
    again = clip_and_noise(update, 0.5, 1.2, torch.Generator().manual_seed(3))
    assert all(torch.equal(out[k], again[k]) for k in out)


def test_clip_and_noise_refuses_non_finite_updates():
    with pytest.raises(ValueError, match="NaN"):
        clip_and_noise({"a": torch.tensor([math.nan])}, 1.0, 1.0, torch.Generator())
    with pytest.raises(ValueError):
        clip_and_noise({"a": torch.ones(2)}, 0.0, 1.0, torch.Generator())


def test_rdp_to_epsilon_rejects_nothing_and_handles_single_order():
    eps, order = rdp_to_epsilon([0.5], [2], 1e-6)
    assert order == 2 and eps == pytest.approx(0.5 + math.log(0.5) - (math.log(1e-6) + math.log(2)))


def test_a_version_one_state_is_reexpressed_at_the_true_sensitivity(tmp_path):
    """Files written before the fix recorded RDP at sensitivity C: loading multiplies by 4 (exact for the
    Gaussian mechanism), so a resumed miner never counts its past rounds at the optimistic figure."""
    path = tmp_path / "old.json"
    old = {"format": "dso-rdp-accountant/v1", "noise_multiplier": 2.0, "delta": 1e-6, "orders": list(range(2, 128)),
           "rdp": gaussian_rdp(range(2, 128), 2.0, sensitivity=1.0), "rounds": 1}
    path.write_text(json.dumps(old))
    loaded = RdpAccountant.load(path)
    fresh = RdpAccountant(2.0, 1e-6)
    fresh.step()
    assert loaded.rdp == pytest.approx(fresh.rdp, rel=1e-12) and loaded.epsilon() == pytest.approx(fresh.epsilon())
    loaded.save(path)
    assert json.loads(path.read_text())["format"] == "dso-rdp-accountant/v2"


@pytest.mark.parametrize("epsilon,rounds,delta", [(8.0, 100, 1e-6), (8.0, 30, 1e-5), (1.0, 1, 1e-6), (50.0, 3, 1e-8)])
def test_noise_for_target_spends_exactly_the_target(epsilon, rounds, delta):
    z = noise_for_target(epsilon, delta, rounds, range(2, 128))
    assert oracle_epsilon(z, rounds, delta)[0] <= epsilon < oracle_epsilon(z * (1 - 1e-6), rounds, delta)[0]
    assert dp_accounting_epsilon(z, rounds, delta)[0] == pytest.approx(epsilon, rel=1e-6)
    acc = RdpAccountant(z, delta)
    acc.step(rounds)
    assert acc.epsilon()[0] <= epsilon and acc.would_exceed(epsilon)      # the budget stops it right there


def test_noise_for_target_refuses_nonsense():
    for args in [(0.0, 1e-6, 10), (8.0, 1e-6, 0), (8.0, 1.5, 10), (math.inf, 1e-6, 10)]:
        with pytest.raises(ValueError):
            noise_for_target(*args, range(2, 128))


def test_the_config_derives_the_noise_from_a_target():
    from dso.config.schema import ConfigError
    from dso.config.sources import from_dict

    cfg = from_dict({"hparams": {"dp": {"enabled": True, "target_epsilon": 8.0, "target_rounds": 100}}})
    z, budget = dp_settings(cfg.hparams.dp)
    assert z == pytest.approx(noise_for_target(8.0, 1e-6, 100, range(2, 128))) and budget == 8.0
    assert z == pytest.approx(13.893, abs=1e-3)
    assert dp_settings(DPConfig()) == (z, budget)                                 # the default target
    assert cfg.hparams.digest() == from_dict(cfg.to_dict()).hparams.digest()     # validation changes nothing
    manual = from_dict({"hparams": {"dp": {"target_epsilon": 0, "noise_multiplier": 2.5, "epsilon_budget": 4}}})
    assert dp_settings(manual.hparams.dp) == (2.5, 4.0)
    with pytest.raises(ConfigError, match="target_rounds"):
        from_dict({"hparams": {"dp": {"target_rounds": 0}}})
    with pytest.raises(ConfigError, match="target_epsilon"):
        from_dict({"hparams": {"dp": {"target_epsilon": 1e-30, "target_rounds": 10**9}}})

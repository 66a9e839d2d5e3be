import math

import numpy as np
import pytest

from dso.training.train import bits_per_byte


def test_known_values():
    assert bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(math.log(256), 128, 128) == pytest.approx(8.0)   # uniform over bytes: 8 bits per byte
    assert bits_per_byte(math.log(1024), 100, 250) == pytest.approx(10 * 100 / 250)


def test_matches_the_total_code_length_of_a_unigram_model():
    """Oracle: a unigram model's code length, summed token by token in bits, divided by the bytes."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(50))
    tokens = rng.choice(50, size=400, p=probs)
    token_bytes = rng.integers(1, 6, size=50)
    total_bits = -np.log2(probs[tokens]).sum()
    mean_nats = -np.log(probs[tokens]).mean()
    nbytes = int(token_bytes[tokens].sum())
    assert bits_per_byte(mean_nats, tokens.size, nbytes) == pytest.approx(total_bits / nbytes)


@pytest.mark.parametrize("tokens, nbytes", [(0, 10), (10, 0), (-1, 5)])
def test_refuses_empty_counts(tokens, nbytes):
    with pytest.raises(ValueError):
        bits_per_byte(1.0, tokens, nbytes)

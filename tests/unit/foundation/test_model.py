import torch

from dso.config.schema import ModelConfig
from dso.nn.model import build_model, model_hash, parameter_count, parameter_kind


def test_default_size_and_tied_embeddings():
    model = build_model(ModelConfig(), seed=1)
    assert 3_000_000 <= parameter_count(model) <= 5_000_000
    assert "head" not in " ".join(n for n, _ in model.named_parameters())  # output reuses embed.weight
    std = model.embed.weight.std().item()
    assert abs(std - 0.02) < 0.001


def test_same_seed_same_hash_and_forward_shape():
    cfg = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, ffn_hidden=64, seq_len=16)
    a, b, c = build_model(cfg, 5), build_model(cfg, 5), build_model(cfg, 6)
    assert model_hash(a) == model_hash(b) != model_hash(c)
    tokens = torch.randint(0, 256, (3, 16))
    assert a(tokens).shape == (3, 16, 256)
    with torch.no_grad():
        a.embed.weight[0, 0] += 1e-7
    assert model_hash(a) != model_hash(b)


def test_causal_future_tokens_do_not_change_past_logits():
    cfg = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, ffn_hidden=64, seq_len=16)
    model = build_model(cfg, 3)
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(x)[0, :10], model(y)[0, :10], atol=1e-6)
        assert not torch.allclose(model(x)[0, 10:], model(y)[0, 10:])


def test_initial_loss_is_near_uniform():
    cfg = ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, ffn_hidden=64, seq_len=16)
    model = build_model(cfg, 0)
    batch = torch.randint(0, 256, (4, 17))
    assert abs(model.loss(batch).item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_a_parameter_the_loss_does_not_reach_has_a_zero_gradient():
    from dso.training.train import compute_gradients

    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, ffn_hidden=32, seq_len=8, vocab_size=256)
    model = build_model(cfg, seed=0)
    model.unused = torch.nn.Parameter(torch.ones(3))  # e.g. a frozen or not yet wired head
    grads, loss = compute_gradients(model, torch.randint(0, 256, (4, 9)), micro_batch=2)
    assert torch.equal(grads["unused"], torch.zeros(3)) and loss > 0
    assert grads["embed.weight"].abs().sum() > 0


def test_every_parameter_of_the_model_has_the_kind_the_codec_budgets_it_by():
    model = build_model(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, ffn_hidden=64, seq_len=16), 0)
    kinds = [parameter_kind(n) for n, _ in model.named_parameters()]
    # the tied embedding; per block 4 attention and 3 feed-forward matrices and 2 norms; the final norm
    assert {k: kinds.count(k) for k in set(kinds)} == {"embed": 1, "attn": 8, "ffn": 6, "other": 5}
    assert parameter_kind("blocks.0.attn_norm.weight") == "other" and parameter_kind("ffn.weight") == "other"

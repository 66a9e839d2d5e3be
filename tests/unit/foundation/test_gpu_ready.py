"""GPU-ready training: bf16 autocast only for CUDA forward passes, fp32 weights/gradients, and an outer step
that gives the same θ_{t+1} whatever device holds the model (the CUDA test runs only where a GPU exists)."""

import pytest
import torch

from dso.nn.model import build_model
from dso.training.train import autocast_dtype, compute_gradients, mixed_precision


def test_autocast_only_on_cuda_with_bf16():
    assert autocast_dtype(torch.device("cpu")) is None
    assert autocast_dtype(torch.device("cuda:0"), bf16_supported=True) is torch.bfloat16
    assert autocast_dtype(torch.device("cuda:0"), bf16_supported=False) is None
    with mixed_precision(torch.device("cpu")):  # a no-op on CPU: full fp32
        assert not torch.is_autocast_enabled("cpu")


def test_bf16_forward_keeps_fp32_weights_and_gradients_close_to_fp32(tiny_hparams):
    """What autocast does on a GPU, reproduced with CPU autocast: the loss in bf16 matmuls, gradients in fp32
    on the fp32 master weights, within a few per cent of the fp32 gradient."""
    hp = tiny_hparams
    model = build_model(hp.model, hp.seed)
    batch = torch.randint(0, hp.model.vocab_size, (4, hp.model.seq_len + 1), generator=torch.Generator().manual_seed(1))
    exact, loss32 = compute_gradients(model, batch, 4)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = model.loss(batch)
    loss.backward()
    assert loss.dtype == torch.float32 and abs(float(loss.detach()) - loss32) < 0.05
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), exact[name].flatten(), dim=0)
        assert float(cosine) > 0.98, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the CPU/GPU "
                    "bit-identity of θ_{t+1} is checked only where a GPU exists")
def test_theta_next_is_bit_identical_on_cpu_and_cuda(tiny_hparams):
    from sim.gpu import aggregate_on_both
    on_cpu, on_gpu = aggregate_on_both(tiny_hparams, windows=3)
    assert on_cpu == on_gpu and len(on_cpu) == 3

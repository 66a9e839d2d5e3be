"""Where each rank's slice of a parameter lies, and which slices the codec can compress on their own
(dso/distributed/sharding.py): pure layout, checked against torch.chunk and the whole tensor's chunk plan."""
import pytest
import torch

from dso.codec.dct import ChunkPlan
from dso.distributed.sharding import aligned, assemble, local_part, local_rows, shard_dim, slice_range


@pytest.mark.parametrize("n", [0, 1, 5, 64, 100, 704, 4096])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_slices_are_torch_chunks_split(n, world):
    chunks = torch.arange(n).chunk(world) if n else ()
    for rank in range(world):
        start, end = slice_range(n, rank, world)
        want = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(range(start, end)) == want


def test_the_sharded_dimension_holds_whole_chunks():
    # a 704 × 256 feed-forward matrix in chunks of 64 × 64: 352 rows per rank is 5.5 chunks, 128 columns are 2
    assert not aligned(704, 64, 2) and aligned(256, 64, 2)
    assert shard_dim(ChunkPlan.for_shape((704, 256), 64, False), 2) == 1
    assert shard_dim(ChunkPlan.for_shape((256, 704), 64, False), 2) == 0
    assert shard_dim(ChunkPlan.for_shape((768, 768), 64, False), 8) is None  # 96 = 1.5 chunks either way
    assert shard_dim(ChunkPlan.for_shape((2048, 2048), 64, False), 8) == 0
    assert shard_dim(ChunkPlan.for_shape((256,), 64, False), 2) == 0
    assert shard_dim(ChunkPlan.for_shape((32,), 64, False), 2) is None  # one chunk of 32: it cannot split


@pytest.mark.parametrize("shape,world", [((704, 256), 2), ((256, 704), 2), ((4096, 256), 4), ((256,), 2),
                                         ((200, 64), 2), ((96, 130), 2)])
@pytest.mark.parametrize("transform", [False, True])
def test_every_rank_encodes_its_part_of_the_whole_tensors_chunks(shape, world, transform):
    """Each rank's chunk rows, from its slice alone, are exactly its rows of the whole tensor's chunk rows; the
    ranks' rows put together (assemble) are the whole tensor's."""
    plan = ChunkPlan.for_shape(shape, 64, transform)
    dim = shard_dim(plan, world)
    if dim is None:
        pytest.skip(f"{shape} has no dimension that splits into whole chunks on {world} ranks")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    whole = plan.encode(x)
    mine = []
    for rank in range(world):
        part = local_part(plan, dim, rank, world)
        piece = part.plan.encode(x.narrow(dim, part.start, part.end - part.start))
        torch.testing.assert_close(piece, local_rows(plan, part, whole), rtol=0, atol=0)
        torch.testing.assert_close(part.plan.decode(piece), x.narrow(dim, part.start, part.end - part.start),
                                   rtol=1e-5, atol=1e-5)
        mine.append(piece)
    torch.testing.assert_close(assemble(plan, dim, mine), whole, rtol=0, atol=0)


# (3, 2) along dim 1 on 3 ranks: the last slice is empty
@pytest.mark.parametrize("shape,dim", [((5, 7), 1), ((7, 5), 0), ((3, 2), 1), ((11,), 0)])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_flat_index_is_found_in_the_slice_that_holds_it(shape, dim, world):
    """A sliced θ's SyncScore sample (dso/distributed/sliced_theta.py ``owner``): the rank and the index into its
    slice of each flat index of the whole tensor, uneven and empty slices included."""
    from dso.config.schema import HParams
    from dso.distributed.ranks import Ranks
    from dso.distributed.sharding import narrow_slice, slice_shape
    from dso.distributed.sliced_theta import SlicedTheta

    whole = torch.arange(float(torch.tensor(shape).prod())).reshape(shape)
    mine = narrow_slice(whole, dim, 0, world)
    assert tuple(mine.shape) == slice_shape(shape, dim, 0, world)
    theta = SlicedTheta({"w": mine}, {"w": shape}, {"w": dim}, Ranks(0, world, torch.device("cpu")), HParams())
    held = [0] * world
    for index in range(whole.numel()):
        rank, local = theta.owner("w", index)
        assert narrow_slice(whole, dim, rank, world).reshape(-1)[local] == index
        held[rank] += 1
    assert held == [int(torch.tensor(slice_shape(shape, dim, r, world)).prod()) for r in range(world)]

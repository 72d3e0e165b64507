"""RowCodec: packing fp32 records at bf16 / fp16, stochastic rounding, the noise hash."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.embedding.codec import RowCodec, from_bits, packed_words, round_nearest, sr_noise, sr_table_keys, to_bits
from ember.mix import mix64, mix64_tensor

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def test_torch_mix_equals_numpy_mix64():
    x = np.array([0, 1, -5, 2**62 + 12345, -(2**63), 2**63 - 1, 987654321987], dtype=np.int64)
    got = mix64_tensor(torch.from_numpy(x)).numpy().view(np.uint64)
    np.testing.assert_array_equal(got, mix64(x.view(np.uint64)))


def test_fp32_codec_is_the_identity():
    c = RowCodec("fp32", 4, 6)
    rec = torch.randn(5, 6)
    assert c.words == 6
    assert c.encode(rec, torch.arange(5), 1, 2) is rec and c.decode(rec) is rec


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dim,width", [(16, 17), (5, 7), (1, 1)])
def test_round_trip_within_one_ulp_and_state_exact(dtype, dim, width):
    c = RowCodec(dtype, dim, width)
    assert c.words == (dim + 1) // 2 + width - dim == packed_words(dtype, dim, width)
    rec = torch.randn(2000, width) * 3
    ids = torch.arange(2000) * 7919
    got = c.decode(c.encode(rec, ids, seed=11, step=3))
    assert torch.equal(got[:, dim:], rec[:, dim:])  # optimizer state / TTL stay fp32, bit-exact
    w = rec[:, :dim]
    # stochastic rounding lands on one of the two neighbours: within one ulp of the target dtype
    ulp = 2.0 ** (-7 if dtype == "bf16" else -10)
    assert ((got[:, :dim] - w).abs() <= w.abs() * ulp * 1.0001 + 1e-7).all()
    # the result is representable: re-encoding it (any noise) changes nothing
    assert torch.equal(c.decode(c.encode(got, ids, seed=5, step=9)), got)
    empty = c.encode(rec[:0], ids[:0], 1, 1)  # a batch with no row of this table
    assert empty.shape == (0, c.words) and c.decode(empty).shape == (0, width)
    # nearest rounding equals torch's own conversion
    near = c.decode(c.encode_nearest(rec))[:, :dim]
    assert torch.equal(near, w.to(TORCH_DTYPE[dtype]).float())


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_stochastic_rounding_is_unbiased(dtype):
    c = RowCodec(dtype, 8, 8)
    vals = torch.tensor([0.1, -0.3, 1.0 + 2**-9, 1e-3, -7.77, 3.3e-5, 1234.5678, -0.0071])
    rec = vals.repeat(20_000, 1)
    got = c.decode(c.encode(rec, torch.arange(20_000), seed=1, step=1)).double().mean(0)
    ulp = vals.abs().double() * 2.0 ** (-7 if dtype == "bf16" else -10)
    # the mean of 20k draws is within ~4 standard errors (<= ulp/2 / sqrt(20k)) of the value
    assert ((got - vals.double()).abs() < 4 * ulp / 2 / np.sqrt(20_000) + 1e-9).all(), (got, vals)
    near = round_nearest(vals, dtype).double()
    assert ((near - vals.double()).abs() > (got - vals.double()).abs()).sum() >= 6  # nearest is biased


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_noise_is_deterministic_per_seed_step_id(dtype):
    c = RowCodec(dtype, 6, 7)
    gen = torch.Generator().manual_seed(11)
    rec = torch.randn(300, 7, generator=gen)
    ids = torch.randint(-(2**62), 2**62, (300,), generator=gen)
    a = c.encode(rec, ids, seed=3, step=4)
    assert torch.equal(a.view(torch.int32), c.encode(rec, ids, seed=3, step=4).view(torch.int32))
    # per row: a row's rounding does not depend on which other rows are encoded with it
    perm = torch.randperm(300, generator=gen)
    b = c.encode(rec[perm], ids[perm], seed=3, step=4)
    assert torch.equal(b.view(torch.int32), a[perm].view(torch.int32))
    # per-row seeds / steps (a group) equal per-table calls
    seeds = torch.tensor([3] * 150 + [8] * 150)
    steps = torch.tensor([4] * 150 + [2] * 150)
    g = c.encode(rec, ids, seeds, steps)
    assert torch.equal(g[:150].view(torch.int32), a[:150].view(torch.int32))
    assert torch.equal(g[150:].view(torch.int32), c.encode(rec[150:], ids[150:], 8, 2).view(torch.int32))
    # and other seeds, steps or IDs give other noise
    n = sr_noise(ids, 3, 4, 6, torch.device("cpu"))
    assert n.shape == (300, 6) and int(n.min()) >= 0 and int(n.max()) < 65536
    assert not torch.equal(n, sr_noise(ids, 3, 5, 6, torch.device("cpu")))
    assert not torch.equal(n, sr_noise(ids + 1, 3, 4, 6, torch.device("cpu")))
    # uniform: mean and spread of a million draws (standard error of the mean ~0.0003 of the range)
    u = sr_noise(torch.arange(-(10**5), 10**5, 3), 3, 4, 15, torch.device("cpu")).double() / 65535
    assert abs(u.mean().item() - 0.5) < 0.003 and abs(u.std().item() - 12**-0.5) < 0.003


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_table_keys_made_on_the_host_give_the_same_noise(dtype):
    """``sr_table_keys`` (the (seed, step) part, made on the host for a group's tables) gives
    the noise of ``sr_noise`` from the seeds and steps, bit for bit: negative seeds, large steps."""
    seeds = np.array([0, -5, 2**62 + 7, -(2**63)], dtype=np.int64)
    steps = np.array([0, 1, 123_456_789, 2**40], dtype=np.int64)
    ids = torch.tensor([3, -(2**63), 2**63 - 1, 42, 7, 0, -1, 9])
    tab = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    cpu = torch.device("cpu")
    want = sr_noise(ids, torch.from_numpy(seeds)[tab], torch.from_numpy(steps)[tab], 5, cpu)
    keys = torch.from_numpy(sr_table_keys(seeds, steps).view(np.int64))[tab]
    assert torch.equal(sr_noise(ids, 0, 0, 5, cpu, table_key=keys), want)
    c = RowCodec(dtype, 5, 7)
    rec = torch.randn(8, 7)
    a = c.encode(rec, ids, torch.from_numpy(seeds)[tab], torch.from_numpy(steps)[tab])
    assert torch.equal(c.encode(rec, ids, 0, 0, table_key=keys).view(torch.int32), a.view(torch.int32))


def test_stochastic_rounding_keeps_tiny_updates_that_nearest_loses():
    """1000 increments of 1e-4 to a weight of 1.0: bf16 spacing there is 2**-7 ~ 0.0078, so
    rounding to nearest drops every increment; stochastic rounding adds ~0.1 on average."""
    c = RowCodec("bf16", 1, 1)
    ids = torch.arange(500)
    sr = torch.ones(500, 1)
    rn = torch.ones(500, 1)
    for step in range(1, 1001):
        sr = c.decode(c.encode(sr + 1e-4, ids, seed=0, step=step))
        rn = c.decode(c.encode_nearest(rn + 1e-4))
    assert torch.equal(rn, torch.ones(500, 1))
    assert abs(sr.mean().item() - 1.1) < 0.01, sr.mean()


def test_specials_signs_and_fp16_saturation():
    rec = torch.tensor([[float("inf"), -float("inf"), float("nan"), -0.0, -1e6, 1e6, 3e-8, -2.5]])
    bf = RowCodec("bf16", 8, 8)
    got = bf.decode(bf.encode(rec, torch.tensor([1]), 0, 0))[0]
    assert got[0] == float("inf") and got[1] == -float("inf") and torch.isnan(got[2])
    assert got[3] == 0 and torch.signbit(got[3]) and got[7] == -2.5
    assert abs(got[4].item() + 1e6) <= 1e6 * 2**-7 and got[6] > 0
    hf = RowCodec("fp16", 8, 8)
    for row in (hf.decode(hf.encode(rec, torch.tensor([1]), 0, 0))[0], hf.decode(hf.encode_nearest(rec))[0]):
        assert row[0] == float("inf") and row[1] == -float("inf") and torch.isnan(row[2])
        assert row[4] == -65504.0 and row[5] == 65504.0  # saturated, documented
        assert row[6] in (0.0, 2.0**-24) and row[7] == -2.5  # 3e-8 is below the least fp16 subnormal: 0 or it


def test_fp16_subnormals_round_stochastically():
    c = RowCodec("fp16", 1, 1)
    v = 1.5 * 2.0**-24  # halfway between the two least fp16 subnormals
    got = c.decode(c.encode(torch.full((20_000, 1), v), torch.arange(20_000), 0, 0))
    assert set(got.flatten().tolist()) == {2.0**-24, 2.0**-23}
    assert abs(got.double().mean().item() / v - 1) < 0.02


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bits_round_trip(dtype):
    w = round_nearest(torch.randn(50, 4), dtype)
    assert torch.equal(from_bits(to_bits(w, dtype), dtype), w)
    with pytest.raises(ValueError, match="fp32 weights are stored as they are"):
        to_bits(w, "fp32")


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        RowCodec("int8", 4, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"records must be float32 \[N, 5\]"):
        RowCodec("bf16", 4, 5).encode(torch.zeros(2, 4), torch.arange(2), 0, 0)


@pytest.mark.parametrize("dim,width,threads", [(16, 17, 1), (5, 7, 1), (1, 1, 1), (3, 12, 1), (20, 21, 1), (35, 40, 1),
                                               (16, 17, 3), (35, 40, 3)])
def test_bf16_cpu_pack_equals_the_torch_path_bit_for_bit(dim, width, threads, monkeypatch):
    """bf16 encode on CPU takes one pass of ``_native.bf16_pack_sr`` (the compiled core, or its
    numpy fallback); both must equal the torch path other devices take, bit for bit: values over
    60 orders of magnitude, NaN, +-inf, the largest finite, -0 and subnormals; per-row and
    scalar seeds and steps; dims past one block of the core's columns (16); rows split over
    threads."""
    from ember import _native

    if threads > 1:
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        monkeypatch.setattr(_native, "MIN_PART_ROWS", 1)
        assert _native.part_count(3000) == (threads if _native.native_parts() else 1)
    from ember.embedding.codec import _bf16_bits

    n = 3000
    gen = torch.Generator().manual_seed(dim)
    rec = torch.randn(n, width, generator=gen) * torch.logspace(-30, 30, n).reshape(-1, 1)
    rec[:6, 0] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3e38, -0.0, 1e-42])
    ids = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    c = RowCodec("bf16", dim, width)
    for seed, step in [(torch.randint(0, 100, (n,), generator=gen), torch.randint(0, 2**40, (n,), generator=gen)), (7, 9)]:
        ref = c._pack(rec, _bf16_bits(rec[:, :dim], sr_noise(ids, seed, step, dim, torch.device("cpu"))))
        got = c.encode(rec, ids, seed, step)
        fallback = torch.empty_like(got)
        per_row = [torch.as_tensor(v).expand(n).contiguous().numpy() for v in (seed, step)]
        _native._bf16_pack_sr_py(rec.numpy(), ids.numpy(), per_row[0], per_row[1], dim, fallback.numpy())
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
        assert torch.equal(fallback.view(torch.int32), ref.view(torch.int32))


def test_bf16_nearest_takes_torchs_conversion_only_where_it_equals_the_bit_arithmetic():
    """Fresh rows round to nearest through torch's one-pass conversion; its bits equal the
    reference's (``_bf16_bits``) for every float32 pattern: NaN (sign kept) and subnormals
    (flushed to zero by AVX512-BF16 conversions) send the tensor to the reference."""
    from ember.embedding.codec import _bf16_bits, _bf16_nearest, _widen

    torch.manual_seed(0)
    edge = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 3.3895314e38, 3.4e38, -3.4e38, 1e-39,
            -1e-39, 2.0**-126, 2.0**-127, 1e-45, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, 1.0 + 2**-9 + 2**-20]
    cases = [torch.empty(5000, 16).uniform_(-0.25, 0.25), torch.randn(10000) * 1e30, torch.randn(10000) * 1e-38,
             torch.randint(-2**31, 2**31 - 1, (100000,), dtype=torch.int32).view(torch.float32),
             *[torch.tensor([1.0, v]) for v in edge]]
    for x in cases:
        ref = _widen(_bf16_bits(x, None).to(torch.int16), "bf16")
        assert torch.equal(_bf16_nearest(x).view(torch.int32), ref.view(torch.int32)), x[:4]

"""Checks of the PyTorch implementation's pieces against plain loops (run: python3 tools/train/test_model.py).

The end-to-end check is on the Rust side (tests/trained_model.rs, tests/eval.rs compare the
engine with fixtures this implementation wrote); these catch a broken piece here first.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepen  # noqa: E402
from evaluate import dequantize  # noqa: E402
from model import Config, CqlmFloat, Nfwht, engram_indices, engram_rows, int8_roundtrip, sinkhorn_route  # noqa: E402


def fnv_loop(words: list[int]) -> int:
    h = 0xCBF29CE484222325
    for w in words:
        for b in w.to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h


def test_engram_rows_are_spec_fnv() -> None:
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 5000, size=(2, 9)).astype(np.uint32)
    for order in (1, 2, 3, 5):
        for head in (0, 1):
            got = engram_rows(toks, order, head, 997)
            for b in range(2):
                for t in range(9):
                    words = [order, head] + [int(toks[b, p]) if p >= 0 else 0xFFFFFFFF for p in range(t - order + 1, t + 1)]
                    assert got[b, t] == fnv_loop(words) % 997, (order, head, b, t)


def test_nfwht_is_the_orthonormal_sylvester_transform() -> None:
    for n in (32, 64, 1024):
        x = torch.randn(3, n, dtype=torch.float64)
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        want = x @ h.T / math.sqrt(n)
        got = Nfwht(n).to(torch.float64)(x)
        assert torch.allclose(got, want, atol=1e-12), n


def test_int8_roundtrip_rounds_half_to_even() -> None:
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -126.5]], dtype=torch.float64)
    assert int8_roundtrip(x).tolist() == [[127.0, 0.0, 2.0, 2.0, -0.0, -126.0]]


def test_sinkhorn_linear_equals_log_space() -> None:
    logits = torch.randn(5, 4, 4, dtype=torch.float64) * 3
    a = sinkhorn_route(logits, 20, exact=True)
    b = sinkhorn_route(logits, 20, exact=False)
    assert torch.allclose(a, b, atol=1e-12)


def test_dequantize_matches_a_loop() -> None:
    rng = np.random.default_rng(2)
    for bits in (1, 2, 4, 8):
        rows, groups, group, cols = 3, 2, 32, 50
        codebook = rng.standard_normal(1 << bits).astype(np.float32)
        norms = rng.standard_normal((rows, groups)).astype(np.float16)
        packed = rng.integers(0, 256, size=(rows, groups * group * bits // 8)).astype(np.uint8)
        got = dequantize(codebook, norms, packed, cols)
        for r in range(rows):
            q = []
            for c in range(groups * group):
                bit = c * bits
                q.append(codebook[(packed[r, bit >> 3] >> (bit & 7)) & ((1 << bits) - 1)])
            q = np.array(q, dtype=np.float64)
            row = []
            for k in range(groups):
                seg = q[k * group:(k + 1) * group]
                h = Nfwht(group).to(torch.float64)(torch.from_numpy(seg)).numpy()
                row.extend(float(norms[r, k]) * h)
            assert np.allclose(got[r], row[:cols], atol=1e-12), bits


def test_blocked_attention_sees_exactly_the_sinks_and_the_window() -> None:
    torch.manual_seed(3)
    cfg = Config(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, hadamard_dim=64, sink=3, window=7)
    cfg.engram.table_rows, cfg.engram.sites, cfg.engram.dim = 31, [0], 8
    m = CqlmFloat(cfg).double().eval()
    with torch.no_grad():
        for n, p in m.params.items():
            if n.endswith(".conv"):
                p.normal_()

    def last(toks: np.ndarray, block: int) -> torch.Tensor:
        return m(torch.from_numpy(toks.astype(np.int64)), engram_indices(cfg, toks), block=block)[0, -1]

    toks = np.random.default_rng(4).integers(0, 64, size=(1, 40)).astype(np.uint32)
    a = last(toks, 5)
    # Blocking does not change the result.
    assert torch.allclose(a, last(toks, 13), atol=1e-12)
    # Position 39 attends to {0, 1, 2} ∪ {33 .. 39}. Token 10 reaches the engram values of
    # positions 10 .. 12 + (taps − 1)·dilation = 21 only, so with one layer it must not matter...
    evicted = toks.copy()
    evicted[0, 10] = (evicted[0, 10] + 1) % 64
    assert torch.allclose(a, last(evicted, 5), atol=1e-12)
    # ... while a sink's token and a token inside the window do.
    for p in (1, 34):
        moved = toks.copy()
        moved[0, p] = (moved[0, p] + 1) % 64
        assert not torch.allclose(a, last(moved, 5), atol=1e-6), p
    # Within sink + window, the blocked path is plain causal attention.
    short = toks[:, :10]
    full = m(torch.from_numpy(short.astype(np.int64)), engram_indices(cfg, short))
    wide = Config(**{**cfg.__dict__, "window": 4})
    m.cfg = wide  # sink + window = 7 < 10: forces the blocked path
    try:
        masked = m(torch.from_numpy(short.astype(np.int64)), engram_indices(cfg, short), block=3)
    finally:
        m.cfg = cfg
    assert torch.allclose(full[0, :7], masked[0, :7], atol=1e-12)
    assert not torch.allclose(full[0, 9], masked[0, 9], atol=1e-6)


def test_inserted_layers_start_as_the_identity() -> None:
    torch.manual_seed(5)
    cfg = Config(vocab=64, hidden=32, layers=8, heads=2, kv_heads=1, head_dim=16, hadamard_dim=64, sink=3, window=60)
    cfg.engram.table_rows, cfg.engram.sites, cfg.engram.dim = 31, [1, 5], 8
    m = CqlmFloat(cfg).double().eval()
    with torch.no_grad():  # a "trained" model: no parameter at its initial value
        for p in m.params.values():
            p.add_(torch.randn_like(p) * 0.3)
            p.copy_(p.float().double())  # checkpoints are f32: the deeper model holds the same values
    toks = np.random.default_rng(6).integers(0, 64, size=(2, 30)).astype(np.uint32)

    def logits(model, c) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.from_numpy(toks.astype(np.int64)), engram_indices(c, toks))

    want = logits(m, cfg)
    for at in (0, 4, 8):
        # off_diagonal -40: the identity route to double precision
        big, big_cfg, names = deepen.insert_layers(m, cfg, at, 4, off_diagonal=-40.0)
        big = big.double().eval()
        assert big_cfg.layers == 12
        assert big_cfg.engram.sites == sorted(s if s < at else s + 4 for s in (1, 5)), (at, big_cfg.engram.sites)
        assert {int(n.split(".")[1]) for n in names} == set(range(at, at + 4))
        got = logits(big, big_cfg)
        assert torch.allclose(got, want, atol=1e-9), (at, (got - want).abs().max())
        with torch.no_grad():  # and a new layer does take part once its gains move
            big.params[f"layers.{at}.mlp_d3"].fill_(0.3)
        assert not torch.allclose(logits(big, big_cfg), want, atol=1e-3), at
    # The shipped setting leaks e^-9 between lanes: close, not equal.
    big, big_cfg, _ = deepen.insert_layers(m, cfg, 4, 4)
    got = logits(big.double().eval(), big_cfg)
    assert (got - want).abs().max() < 1e-2 * want.abs().max()
    for bad in ((4, 2), (9, 4), (0, 0)):
        try:
            deepen.insert_layers(m, cfg, *bad)
        except ValueError:
            continue
        raise AssertionError(f"insert_layers{bad} accepted")


def test_decision_chars_are_where_a_calls_values_start_and_end() -> None:
    from finetune import decision_chars

    call = '{"name":"lookup_verse","arguments":{"book":"Song of Solomon","chapter":12,"verse":3}}'
    text = f'<|user|>"book":"x" Song of Solomon 12:3<|end|><|assistant|><tool_call>{call}</tool_call>'
    base = text.index("<tool_call>") + len("<tool_call>")
    want = set()
    for value in ('"lookup_verse"', '"Song of Solomon"', ":12,", ":3}"):
        i = base + call.index(value)
        want |= {i + 1, i + len(value) - 1}  # the first character, the one after the last
    assert decision_chars(text) == want, (sorted(decision_chars(text)), sorted(want))
    assert decision_chars(text.replace("<tool_call>", "")) == set()  # outside a call: nothing


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)

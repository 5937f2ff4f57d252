"""A float, dense-weight implementation of the cqlm token step (SPEC §4) for whole sequences.

Written from SPEC.md, independently of the Rust engine. Every CQ matrix of SPEC §3 is one
dense `[rows, cols]` parameter here (the `cqlm pack` input format); the F32 vectors keep
their SPEC shapes and names, so `state_dict()` *is* a float checkpoint.

Two attention modes share one code path:

- training: the sequence fits in `sink + window`, so causal attention over the whole
  sequence is exactly SPEC §4.3's attended set;
- evaluation of long texts (`forward(..., block=...)`): queries run in blocks, each
  attending to the sinks and its own sliding window, the SPEC §4.3 rule for any length;
  `kv_int8=True` also rounds every stored key and value to int8 with SPEC's per-(position,
  head) scale, so the float model reproduces the engine's arithmetic up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


@dataclass
class Engram:
    sites: list[int]
    orders: list[int]
    hash_heads: int
    dim: int
    taps: int
    dilation: int
    table_rows: int  # T[n, h], the same for every table here

    def json(self) -> dict:
        return {k: getattr(self, k) for k in ("sites", "orders", "hash_heads", "dim", "taps", "dilation")}


@dataclass
class Config:
    vocab: int = 4096
    hidden: int = 256
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    hadamard_dim: int = 1024
    rope_theta: float = 10000.0
    sink: int = 4
    window: int = 256
    sinkhorn_iters: int = 20
    bos: int = 1
    eos: int = 2
    engram: Engram | None = field(
        default_factory=lambda: Engram(sites=[1, 5], orders=[2, 3], hash_heads=2, dim=64, taps=4, dilation=3, table_rows=8192)
    )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def engram_width(self) -> int:
        e = self.engram
        return len(e.orders) * e.hash_heads * e.dim if e else 0

    def json(self) -> dict:
        """The SPEC §1 config object."""
        return {
            "format": "cqlm",
            "version": 1,
            "vocab": self.vocab,
            "hidden": self.hidden,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "lanes": 4,
            "hadamard_dim": self.hadamard_dim,
            "rope_theta": self.rope_theta,
            "sink": self.sink,
            "window": self.window,
            "sinkhorn_iters": self.sinkhorn_iters,
            "engram": self.engram.json() if self.engram else None,
            "bos": self.bos,
            "eos": self.eos,
        }

    @staticmethod
    def from_json(obj: dict, table_rows: int) -> "Config":
        e = obj["engram"]
        return Config(
            vocab=obj["vocab"], hidden=obj["hidden"], layers=obj["layers"], heads=obj["heads"],
            kv_heads=obj["kv_heads"], head_dim=obj["head_dim"], hadamard_dim=obj["hadamard_dim"],
            rope_theta=float(obj["rope_theta"]), sink=obj["sink"], window=obj["window"],
            sinkhorn_iters=obj["sinkhorn_iters"], bos=obj["bos"], eos=obj["eos"],
            engram=Engram(table_rows=table_rows, **e) if e else None,
        )


# ---------------------------------------------------------------- engram hashing (SPEC §4.2)


def engram_rows(tokens: np.ndarray, order: int, head: int, table_rows: int) -> np.ndarray:
    """Row index of table (order, head) at every position of `tokens` (`[..., S]` u32).

    FNV-1a 64 over the little-endian bytes of `order, head, tok[t-order+1] .. tok[t]`, with
    `tok[p] = 0xFFFFFFFF` for `p < 0` (positions are counted from the start of `tokens`).
    """
    tokens = tokens.astype(np.uint64)
    h = np.full(tokens.shape, FNV_OFFSET, dtype=np.uint64)

    def feed(h: np.ndarray, word) -> np.ndarray:
        word = np.asarray(word, dtype=np.uint64)
        for k in range(4):
            h = (h ^ ((word >> np.uint64(8 * k)) & np.uint64(0xFF))) * FNV_PRIME
        return h

    with np.errstate(over="ignore"):
        h = feed(h, order)
        h = feed(h, head)
        for back in range(order - 1, -1, -1):
            shifted = np.full(tokens.shape, 0xFFFFFFFF, dtype=np.uint64)
            if back == 0:
                shifted[...] = tokens
            elif back < tokens.shape[-1]:
                shifted[..., back:] = tokens[..., :-back]
            h = feed(h, shifted)
    return (h % np.uint64(table_rows)).astype(np.int64)


def engram_indices(cfg: Config, tokens: np.ndarray) -> torch.Tensor:
    """`[len(orders) * hash_heads, ...tokens.shape]` row indices, tables in SPEC order."""
    e = cfg.engram
    rows = [engram_rows(tokens, n, h, e.table_rows) for n in e.orders for h in range(e.hash_heads)]
    return torch.from_numpy(np.stack(rows))


# ---------------------------------------------------------------- SPEC §0 helpers


def rms_unit(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def zcrms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return rms_unit(x) * (1.0 + w)


def hadamard(n: int, dtype=torch.float32) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


class Nfwht(nn.Module):
    """Orthonormal Walsh–Hadamard transform along the last axis (natural order).

    `H_n = H_a ⊗ H_b` with `n = a·b`, so on `x` viewed as `[a, b]` it is `H_a · X · H_b`:
    two small matmuls instead of one `n × n` one.
    """

    def __init__(self, n: int):
        super().__init__()
        a = 1 << (int(math.log2(n)) // 2)
        b = n // a
        self.a, self.b, self.scale = a, b, 1.0 / math.sqrt(n)
        self.register_buffer("ha", hadamard(a), persistent=False)
        self.register_buffer("hb", hadamard(b), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(*shape[:-1], self.a, self.b)
        x = torch.matmul(self.ha.to(x.dtype), torch.matmul(x, self.hb.to(x.dtype)))
        return x.reshape(shape) * self.scale


def rope_tables(cfg: Config, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[S, head_dim/2]`: θ_i = t · theta^(−2i/head_dim) in f64, then rounded to f32."""
    half = cfg.head_dim // 2
    inv = cfg.rope_theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / cfg.head_dim)
    theta = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(theta).float().to(dtype), torch.sin(theta).float().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, heads, S, head_dim]`; rotates the pairs (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


# Called with every `x / scale` that `int8_roundtrip` rounds (`evaluate.py` uses it to find
# codes that sit on a rounding boundary).
INT8_OBSERVERS: list = []


def int8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """SPEC §4.3 KV store and read-back per vector (last axis): scale = max(1e-12, max|x|)/127,
    code = clamp(round_half_even(x / scale), −127, 127), value = code · scale."""
    scale = torch.clamp(x.abs().amax(-1, keepdim=True), min=1e-12) / 127.0
    for observe in INT8_OBSERVERS:
        observe(x / scale)
    return torch.clamp(torch.round(x / scale), -127, 127) * scale


def sinkhorn_route(logits: torch.Tensor, iters: int, exact: bool = True) -> torch.Tensor:
    """`[..., 4, 4]` Sinkhorn: rows then columns, `iters` times; returns the routing matrix.

    `exact`: SPEC §4.3's log-space iteration. Otherwise the same iteration in linear space
    (row and column sums; equal in exact arithmetic, a few ops cheaper, used for training).
    """
    if exact:
        for _ in range(iters):
            logits = logits - torch.logsumexp(logits, -1, keepdim=True)
            logits = logits - torch.logsumexp(logits, -2, keepdim=True)
        return torch.exp(logits)
    r = torch.softmax(logits, -1)
    r = r / r.sum(-2, keepdim=True)
    for _ in range(iters - 1):
        r = r / r.sum(-1, keepdim=True)
        r = r / r.sum(-2, keepdim=True)
    return r


# ---------------------------------------------------------------- the model


class CqlmFloat(nn.Module):
    """SPEC §4 on whole sequences with dense float weights; parameter names are SPEC §3's."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        H, L = cfg.hidden, cfg.layers

        def mat(rows, cols, std=0.02):
            return nn.Parameter(torch.randn(rows, cols) * std)

        def vec(n, value=0.0):
            return nn.Parameter(torch.full((n,), float(value)))

        self.params: dict[str, nn.Parameter] = {}

        def add(name, param):
            self.params[name] = param
            self.register_parameter(name.replace(".", "__"), param)

        add("embed", mat(cfg.vocab, H))
        add("final_norm", vec(H))
        add("mhc.phi_pre", mat(L * 4, 4 * H))
        add("mhc.phi_post", mat(L * 4, 4 * H))
        add("mhc.phi_res", mat(L * 16, 4 * H))
        add("mhc.a_pre", vec(L, 0.1))
        add("mhc.a_post", vec(L, 0.1))
        add("mhc.a_res", vec(L, 0.1))
        add("mhc.b_pre", nn.Parameter(torch.zeros(L, 4)))
        add("mhc.b_post", nn.Parameter(torch.zeros(L, 4)))
        add("mhc.b_res", nn.Parameter((torch.eye(4) * 6.0 - 6.0).reshape(1, 16).repeat(L, 1)))
        out_std = 0.02 / math.sqrt(2 * L)
        for l in range(L):
            pre = f"layers.{l}."
            for n in ("attn_norm", "attn_post_norm", "mlp_norm"):
                add(pre + n, vec(H))
            add(pre + "wq", mat(cfg.q_dim, H))
            add(pre + "wg", mat(cfg.q_dim, H))
            add(pre + "wk", mat(cfg.kv_dim, H))
            add(pre + "wv", mat(cfg.kv_dim, H))
            add(pre + "wo", mat(H, cfg.q_dim, out_std))
            add(pre + "q_norm", vec(cfg.head_dim))
            add(pre + "k_norm", vec(cfg.head_dim))
            add(pre + "attn_out_scale", vec(1, 0.3))
            add(pre + "mlp_d1", vec(cfg.hadamard_dim, 1.0))
            add(pre + "mlp_d2", vec(cfg.hadamard_dim, 1.0))
            add(pre + "mlp_d3", vec(cfg.hadamard_dim, 0.3))
        e = cfg.engram
        if e:
            for n in e.orders:
                for h in range(e.hash_heads):
                    add(f"engram.table.{n}.{h}", mat(e.table_rows, e.dim, 1.0))
            for s in e.sites:
                add(f"engram.{s}.wk", mat(H, cfg.engram_width, 1.0 / math.sqrt(cfg.engram_width)))
                add(f"engram.{s}.wv", mat(H, cfg.engram_width, 0.3 / math.sqrt(cfg.engram_width)))
                add(f"engram.{s}.conv", nn.Parameter(torch.zeros(e.taps, H)))
                add(f"engram.{s}.norm_u", vec(H))
                add(f"engram.{s}.norm_k", vec(H))
        self.nfwht = Nfwht(cfg.hadamard_dim)

    def named_spec_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor under its SPEC §3 name (CQ matrices dense), detached f32."""
        return {k: v.detach().float().contiguous() for k, v in self.params.items()}

    def load_spec_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for k, v in self.params.items():
            src = tensors[k]
            if tuple(src.shape) != tuple(v.shape):
                raise ValueError(f"{k}: shape {tuple(src.shape)}, model wants {tuple(v.shape)}")
            with torch.no_grad():
                v.copy_(src.to(v.dtype))

    # ------------------------------------------------------------ pieces

    def _engram_values(self, rows: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """rows `[tables, B, S]` → per site (key, value), each `[B, S, hidden]`."""
        e, P = self.cfg.engram, self.params
        tables = [P[f"engram.table.{n}.{h}"] for n in e.orders for h in range(e.hash_heads)]
        emb = torch.cat([F.embedding(rows[i], t) for i, t in enumerate(tables)], -1)
        out = {}
        S = rows.shape[-1]
        for s in e.sites:
            v = emb @ P[f"engram.{s}.wv"].T
            key = emb @ P[f"engram.{s}.wk"].T
            conv = P[f"engram.{s}.conv"]
            m = torch.zeros_like(v)
            for j in range(e.taps):
                d = j * e.dilation
                if d == 0:
                    m = m + conv[j] * v
                elif d < S:
                    m = m + F.pad(conv[j] * v[:, : S - d], (0, 0, d, 0))
            out[s] = (key, v + F.silu(m))
        return out

    def _attention(self, q, k, v, kv_int8: bool, block: int | None) -> torch.Tensor:
        """q `[B, heads, S, d]`, k/v `[B, kv_heads, S, d]` (ZCRMS and RoPE done) → `[B, heads, S, d]`."""
        cfg = self.cfg
        if kv_int8:
            k, v = int8_roundtrip(k), int8_roundtrip(v)
        rep = cfg.heads // cfg.kv_heads
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        S = q.shape[2]
        if block is None or S <= cfg.sink + cfg.window:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        outs = []
        sink, window = cfg.sink, cfg.window
        for s0 in range(0, S, block):
            s1 = min(S, s0 + block)
            lo = max(sink, s0 - window + 1)
            keys = torch.cat([torch.arange(min(sink, lo)), torch.arange(lo, s1)])
            t = torch.arange(s0, s1)[:, None]
            p = keys[None, :]
            allowed = (p <= t) & ((p < sink) | (p >= t - window + 1))
            mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
            outs.append(F.scaled_dot_product_attention(q[:, :, s0:s1], k[:, :, keys], v[:, :, keys], attn_mask=mask))
        return torch.cat(outs, 2)

    # ------------------------------------------------------------ forward

    def forward(self, tokens: torch.Tensor, rows: torch.Tensor | None, kv_int8: bool = False,
                block: int | None = None, want_lanes: bool = False):
        """tokens `[B, S]` (position 0 = logical position 0) and engram rows `[tables, B, S]`
        → logits `[B, S, vocab]` (row t predicts token t+1). With `want_lanes`, also the
        lanes `[B, S, 4, hidden]` after every layer."""
        cfg, P = self.cfg, self.params
        B, S = tokens.shape
        H = cfg.hidden
        dtype = P["embed"].dtype
        x0 = F.embedding(tokens, P["embed"]) * math.sqrt(H)
        lanes = x0[:, :, None, :].expand(B, S, 4, H)
        eng = self._engram_values(rows) if cfg.engram else {}
        cos, sin = rope_tables(cfg, torch.arange(S), dtype)
        scale_h = 1.0 / math.sqrt(H)
        seen = []
        for l in range(cfg.layers):
            pre = f"layers.{l}."
            xhat = rms_unit(lanes.reshape(B, S, 4 * H))
            p_pre = xhat @ P["mhc.phi_pre"][4 * l: 4 * l + 4].T
            p_post = xhat @ P["mhc.phi_post"][4 * l: 4 * l + 4].T
            p_res = xhat @ P["mhc.phi_res"][16 * l: 16 * l + 16].T
            off = torch.full((4,), -4.0, dtype=dtype)
            off[l % 4] = 4.0
            hpre = torch.sigmoid(P["mhc.a_pre"][l] * p_pre + P["mhc.b_pre"][l] + off)
            u = (hpre[..., None] * lanes).sum(2)
            b = u
            if l in eng:
                key, value = eng[l]
                alpha = torch.sigmoid(
                    (zcrms(u, P[f"engram.{l}.norm_u"]) * zcrms(key, P[f"engram.{l}.norm_k"])).sum(-1, keepdim=True) * scale_h
                )
                b = u + alpha * value
            a = zcrms(b, P[pre + "attn_norm"])
            q = (a @ P[pre + "wq"].T).view(B, S, cfg.heads, cfg.head_dim).transpose(1, 2)
            k = (a @ P[pre + "wk"].T).view(B, S, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            v = (a @ P[pre + "wv"].T).view(B, S, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            g = a @ P[pre + "wg"].T
            q = rope(zcrms(q, P[pre + "q_norm"]), cos, sin)
            k = rope(zcrms(k, P[pre + "k_norm"]), cos, sin)
            o = self._attention(q, k, v, kv_int8, block)
            o = o.transpose(1, 2).reshape(B, S, cfg.q_dim) * torch.sigmoid(g)
            attn = o @ P[pre + "wo"].T
            after = b + P[pre + "attn_out_scale"] * zcrms(attn, P[pre + "attn_post_norm"])
            z = zcrms(after, P[pre + "mlp_norm"])
            z = F.pad(z, (0, cfg.hadamard_dim - H)) * P[pre + "mlp_d1"]
            z = self.nfwht(z)
            z = F.silu(P[pre + "mlp_d2"] * z)
            z = self.nfwht(z) * P[pre + "mlp_d3"]
            out = after + z[..., :H]
            update = out - u
            hpost = 2.0 * torch.sigmoid(P["mhc.a_post"][l] * p_post + P["mhc.b_post"][l] + off)
            route_logits = (P["mhc.a_res"][l] * p_res + P["mhc.b_res"][l]).view(B, S, 4, 4)
            route = sinkhorn_route(route_logits, cfg.sinkhorn_iters, exact=not self.training)
            lanes = route @ lanes + hpost[..., None] * update[:, :, None, :]
            if want_lanes:
                seen.append(lanes)
        hs = lanes.mean(2)
        logits = zcrms(hs, P["final_norm"]) @ P["embed"].T
        return (logits, seen) if want_lanes else logits

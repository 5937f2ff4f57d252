"""Make a trained model deeper without changing what it computes (function-preserving growth).

`insert_layers(model, cfg, at, n)` returns a model of `cfg.layers + n` layers in which
layers `at .. at+n-1` are new and every old layer keeps its weights under its new index. A
new layer starts as the identity on the lanes:

- its branch adds nothing: `attn_out_scale = 0` and `mlp_d3 = 0`, so `out = u` and the
  update is zero (both gains still get gradients, so the layer learns from the first step);
- its route is the identity up to e^off_diagonal per off-diagonal entry: `mhc.phi_res` rows
  zero and `mhc.b_res` 0 on the diagonal, `off_diagonal` (default -9) off it (SPEC's
  Sinkhorn then returns ~I).

`n` must be a multiple of 4: SPEC §4's mHC reads mostly from lane `layer % 4`, so shifting
the later layers by a multiple of 4 keeps each one reading the lane it was trained on.
Engram sites at or after `at` move with their layers. The other new weights (queries, keys,
values, gates, norms) take `CqlmFloat`'s fresh initialization.
"""

from __future__ import annotations

import torch

from model import Config, CqlmFloat


def insert_layers(model: CqlmFloat, cfg: Config, at: int, n: int,
                  off_diagonal: float = -9.0) -> tuple[CqlmFloat, Config, list[str]]:
    """The deeper model, its config, and the names of the new layers' own tensors
    (`layers.{l}.*`; the new rows of the stacked `mhc.*` tensors are not listed)."""
    if n <= 0 or n % 4:
        raise ValueError(f"insert {n} layers: must be a positive multiple of 4 (mHC's lane of a layer is layer % 4)")
    if not 0 <= at <= cfg.layers:
        raise ValueError(f"insert at {at}: the model has {cfg.layers} layers")
    moved = {l: (l if l < at else l + n) for l in range(cfg.layers)}
    obj = cfg.json()
    obj["layers"] = cfg.layers + n
    if obj["engram"]:
        obj["engram"]["sites"] = [moved[s] for s in obj["engram"]["sites"]]
    big_cfg = Config.from_json(obj, cfg.engram.table_rows if cfg.engram else 1)
    big = CqlmFloat(big_cfg)
    old = model.named_spec_tensors()
    new = big.named_spec_tensors()
    new_layers = set(range(at, at + n))
    with torch.no_grad():
        for name, t in old.items():
            if name.startswith("mhc."):  # stacked over layers: the same rows for each
                r = t.shape[0] // cfg.layers
                for l, nl in moved.items():
                    new[name][nl * r:(nl + 1) * r] = t[l * r:(l + 1) * r]
            elif name.startswith("layers."):
                l, rest = name[len("layers."):].split(".", 1)
                new[f"layers.{moved[int(l)]}.{rest}"] = t
            elif name.startswith("engram.") and not name.startswith("engram.table."):
                s, rest = name[len("engram."):].split(".", 1)
                new[f"engram.{moved[int(s)]}.{rest}"] = t
            else:
                new[name] = t
        route = torch.full((4, 4), off_diagonal).fill_diagonal_(0.0).reshape(16)
        for l in new_layers:
            new[f"layers.{l}.attn_out_scale"].zero_()
            new[f"layers.{l}.mlp_d3"].zero_()
            new["mhc.phi_res"][16 * l:16 * (l + 1)].zero_()
            new["mhc.b_res"][l] = route
    big.load_spec_tensors(new)
    names = [k for k in big.params if k.startswith("layers.") and int(k.split(".")[1]) in new_layers]
    return big, big_cfg, names

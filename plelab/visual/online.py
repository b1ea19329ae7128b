"""Training an online quantizer alongside a visual run, or before it (then frozen).

The quantizer sees its own stream of training scenes — a :class:`~plelab.visual.sampler.SceneSampler`
seeded by ``visual.data_seed``, ``visual.quantizer_batch`` images a step — and takes one Adam step
per LM step on its own losses (:mod:`plelab.visual.quantizers`). Its trajectory therefore depends on
the data seed only: at step t it is the same quantizer in every LM seed and arm, so row k of the
visual table means the same thing across seeds at any step, and the frozen arm (``visual.online=
false``: pretrained for ``train.steps`` steps, then fixed) holds exactly the online arm's final
quantizer. The two arms differ by one thing: whether the table saw IDs that moved.
"""

from __future__ import annotations

import numpy as np
import torch

from plelab.config.schema import RunConfig
from plelab.runtime import param_seed
from plelab.visual.ids import patches
from plelab.visual.quantizers import OnlineQuantizer, build_quantizer, single_thread
from plelab.visual.sampler import SceneSampler

PREFIX, OPT_PREFIX = "quantizer.", "quantizer_opt."


def patch_pixels(images: np.ndarray, patch: int) -> torch.Tensor:
    """uint8 ``[N,S,S,3]`` -> ``[N, P, patch·patch·3]`` in [−1, 1], raster order (reconstruction targets)."""
    p = patches(images, patch)
    return torch.from_numpy(p.reshape(p.shape[0], p.shape[1], -1).astype(np.float32) / 127.5 - 1.0)


class QuantizerTrainer:
    def __init__(self, cfg: RunConfig, feats: torch.Tensor, pixels: torch.Tensor) -> None:
        v = cfg.visual
        self.batch = v.quantizer_batch
        self.feats, self.pixels = feats, pixels
        self.quantizer: OnlineQuantizer = build_quantizer(v.ids, feats.shape[-1], v.k, pixels.shape[-1],
                                                          seed=v.data_seed)
        self.opt = torch.optim.Adam(self.quantizer.parameters(), lr=v.quantizer_lr)
        self.sampler = SceneSampler(len(feats), param_seed(v.data_seed, "quantizer"))
        self.steps = 0
        self.last_losses: dict[str, float] = {}

    def step(self) -> dict[str, float]:
        """One update on the next batch of the quantizer's own stream."""
        idx = self.sampler.batch(self.steps, self.batch)
        q = self.quantizer.train()
        with torch.autocast("cpu", enabled=False), single_thread():
            _, losses = q(self.feats[idx].flatten(0, 1).float(), self.pixels[idx].flatten(0, 1))
            self.opt.zero_grad(set_to_none=True)
            losses["total"].backward()
            self.opt.step()
        self.steps += 1
        self.last_losses = {k: float(v.detach()) for k, v in losses.items()}
        return self.last_losses

    def assign(self, feats: torch.Tensor) -> torch.Tensor:
        """IDs ``[B, P]`` of patch features ``[B, P, D]`` from the current quantizer (no update)."""
        return self.quantizer.assign(feats.flatten(0, 1).float()).view(feats.shape[:2])

    # ---- checkpoint state (tensors only: saved with the run's optimizer file) --------------------
    def state(self) -> dict[str, torch.Tensor]:
        out = {PREFIX + k: v.detach().clone() for k, v in self.quantizer.state_dict().items()}
        for i, st in self.opt.state_dict()["state"].items():
            out.update({f"{OPT_PREFIX}{i}.{k}": torch.as_tensor(v).clone() for k, v in st.items()})
        out[PREFIX + "_steps"] = torch.tensor(self.steps)
        events = [(s, c) for s, codes in getattr(self.quantizer, "restarts", []) for c in codes]
        out[PREFIX + "_restarts"] = torch.tensor(events, dtype=torch.long).view(-1, 2)
        gen = getattr(self.quantizer, "restart_gen", None)
        if gen is not None:
            out[PREFIX + "_restart_rng"] = gen.get_state()
        return out

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        own = {k[len(PREFIX):]: v for k, v in tensors.items() if k.startswith(PREFIX) and not k[len(PREFIX):]
               .startswith("_")}
        self.quantizer.load_state_dict(own)
        sd = self.opt.state_dict()
        state: dict[int, dict] = {}
        for k, v in tensors.items():
            if k.startswith(OPT_PREFIX):
                i, name = k[len(OPT_PREFIX):].split(".", 1)
                state.setdefault(int(i), {})[name] = v.clone()
        self.opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
        self.steps = int(tensors[PREFIX + "_steps"])
        if hasattr(self.quantizer, "restarts"):
            by_step: dict[int, list[int]] = {}
            for s, c in tensors[PREFIX + "_restarts"].tolist():
                by_step.setdefault(s, []).append(c)
            self.quantizer.restarts = sorted(by_step.items())
            self.quantizer.restart_gen.set_state(tensors[PREFIX + "_restart_rng"])
        self.quantizer.steps = self.steps


def pretrained_frozen(cfg: RunConfig, feats: torch.Tensor, pixels: torch.Tensor) -> OnlineQuantizer:
    """The quantizer after ``train.steps`` updates on its stream, frozen (the online arm's final state)."""
    qt = QuantizerTrainer(cfg, feats, pixels)
    for _ in range(cfg.train.steps):
        qt.step()
    qt.quantizer.eval().requires_grad_(False)
    return qt.quantizer

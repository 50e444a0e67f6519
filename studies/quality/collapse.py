"""Why seven epochs of the converged studies ended at chance: the experiments behind
docs/quality-runs/collapses.json (results in docs/quality-runs/collapse-experiments/).

Every epoch whose test accuracy fell to 10% ended with a final batch of 1 to 6 samples (the
plan's kept count modulo the batch size of 128). :class:`Probe` tests that on the study's own
runs: it follows a run through ``train.train_run`` and, at the end of every epoch, forks the model
and the optimiser from the state before the epoch's final batch and records the fork's test
accuracy under these keys: ``without_final`` (the final batch not trained); ``size_<s>`` (the final
batch replaced by its first s samples, filled up from the batch before it, s in ``SIZES``); and one
sample trained with only the weights moving (``one_weights_only``: the BatchNorm running statistics
put back), only the BatchNorm statistics moving (``one_bn_stats_only``: a forward pass in training
mode), its gradient scaled down to the 128-sample step's norm (``one_clipped``), BatchNorm in
evaluation mode (``one_running_stats``), or its weighted loss divided by 128 instead of averaged
(``one_nominal``, the library's remedy). ``drop_below`` changes the run itself: a final batch with
fewer samples is not trained (``batched(..., partial=False)`` / ``drop_last=True``).

The experiments reproduce the collapsed runs, so they train with the loop those runs had: each
batch's loss averaged over its own length (``train_run(..., nominal_batch=False)``). The collapsed
runs' augmentation draws were not seeded (the loader's are now: ``pipeline.crop_and_flip``), and the
training order's seeds have changed since, so a rerun is another sample of its run, not a replay: its
kept counts and final batches differ; the E = 72 runs were trained in the same order every epoch, their reruns
reshuffle every epoch as the study now does.

python -m studies.quality.collapse --run infobatch --until 10     # one experiment
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from tools.results import argv_labels

SIZES = (1, 2, 4, 8, 32, 128)


class Probe:
    """Hooks ``train_run`` calls: :meth:`train_batch` before each batch is trained (False: skip
    it), :meth:`after_epoch` once the epoch's test accuracy is measured (its dict goes into the
    epoch's record as ``probe``)."""

    def __init__(self, batch: int, sizes: tuple[int, ...] = SIZES, drop_below: int = 0, forks: bool = True,
                 fork_epochs: set[int] | None = None) -> None:  # fmt: skip
        self.batch, self.sizes, self.drop_below, self.forks = batch, sizes, drop_below, forks
        self.fork_epochs = fork_epochs  # None: every epoch
        self.epoch = 0
        self._last: tuple | None = None  # (model state, optimiser states, x, y, w) before the latest batch
        self._prev: tuple | None = None  # the batch before it: (x, y, w)
        self.skipped = 0
        self._size: int | None = None  # the latest batch's samples
        self._weights: Any = None

    def train_batch(self, model: Any, opts: list, x: Any, y: Any, w: Any) -> bool:
        self._size, self._weights = len(y), w
        if self.forks:
            if self._last is not None:
                self._prev = self._last[2:]
            self._last = (copy.deepcopy(model.state_dict()), [copy.deepcopy(o.state_dict()) for o in opts], x, y, w)
        if len(y) < self.batch and len(y) < self.drop_below:
            self.skipped += 1
            return False
        return True

    def after_epoch(self, model: Any, opts: list, test_set: list, device: str) -> dict:
        import torch

        from studies.quality.pipeline import evaluate

        out: dict[str, Any] = {}
        if self._size is None:
            return out
        size, self._size = self._size, None
        out["final_batch"] = size
        out["final_batch_trained"] = not (size < self.batch and size < self.drop_below)
        out["final_weights"] = sorted({round(float(v), 4) for v in self._weights})
        if self._last is None:  # no forks
            return out
        (model_state, opt_states, *final), prev = self._last, self._prev
        self._last = self._prev = None
        epoch, self.epoch = self.epoch, self.epoch + 1
        if self.fork_epochs is not None and epoch not in self.fork_epochs:
            return out
        end_model = copy.deepcopy(model.state_dict())
        end_opts = [copy.deepcopy(o.state_dict()) for o in opts]
        pool = _pool(final, prev)
        one = [a[:1] for a in pool]

        def restore() -> None:  # the optimiser adopts the tensors it loads: give it copies
            model.load_state_dict(model_state)
            for o, s in zip(opts, opt_states):
                o.load_state_dict(copy.deepcopy(s))

        def measure(name: str) -> None:  # the fork's test accuracy, then back to the state before the final batch
            out[name] = evaluate(model, test_set, device)
            restore()

        t0 = time.perf_counter()
        restore()
        out["lr"] = opts[0].param_groups[0]["lr"]
        measure("without_final")
        for s in self.sizes:
            out[f"grad_norm_{s}"] = _step(model, opts, *(a[:s] for a in pool), device)
            measure(f"size_{s}")
        _step(model, opts, *one, device)
        model.load_state_dict({k: v for k, v in model_state.items() if "running" in k or "num_batches" in k},
                              strict=False)  # fmt: skip
        measure("one_weights_only")  # the BatchNorm statistics put back: only the weights moved
        with torch.no_grad():
            model(one[0].to(device))
        measure("one_bn_stats_only")
        _step(model, opts, *one, device, clip=out[f"grad_norm_{self.sizes[-1]}"])
        measure("one_clipped")
        model.eval()  # BatchNorm normalises with its running statistics, not the sample's own
        _step(model, opts, *one, device)
        model.train()
        measure("one_running_stats")
        _step(model, opts, *one, device, nominal=self.batch)
        measure("one_nominal")
        model.load_state_dict(end_model)
        for o, s in zip(opts, end_opts):
            o.load_state_dict(s)
        out["probe_seconds"] = round(time.perf_counter() - t0, 1)
        return out


def _pool(final: list, prev: tuple | None) -> tuple:
    """The final batch's samples first, then those of the batch before it."""
    import torch

    x, y, w = final
    w = torch.as_tensor(w, dtype=torch.float32)
    if prev is None:
        return x, list(y), w
    px, py, pw = prev
    return torch.cat([x, px]), list(y) + list(py), torch.cat([w, torch.as_tensor(pw, dtype=torch.float32)])


def _step(model: Any, opts: list, x: Any, y: Any, w: Any, device: str, clip: float | None = None,
          nominal: int | None = None) -> float:  # fmt: skip
    """One training step on (x, y, w) exactly as train_run makes it; returns the gradient norm.
    ``clip``: the gradient is scaled down to this norm first, where it is larger; ``nominal``:
    the weighted losses are divided by this batch size instead of averaged (the library's remedy)."""
    import torch
    import torch.nn.functional as F

    import seta_stream as seta

    y = torch.as_tensor([int(v) for v in y]).to(device)
    losses = F.cross_entropy(model(x.to(device)), y, reduction="none").float()
    for o in opts:
        o.zero_grad(set_to_none=True)
    seta.weighted_mean(losses, w, batch_size=nominal).backward()
    norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    if clip is not None and norm > clip:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(clip / norm)
    for o in opts:
        o.step()
    return round(norm, 4)


#: The runs collapses.json names: the converged study's configuration of each collapse (augmented,
#: seed 0; E = 36, and E = 72 for the two same-order runs that collapsed in epoch 1), and full
#: data at E = 36 as the control: (policy, params, label, E).
RUNS = {
    "infobatch": ("infobatch", {"r": 0.5}, "p30", 36),
    "seta-p50": ("seta", {"r": 0.1, "k": 10, "alpha": 0.6}, "p50", 36),
    "seta-p70": ("seta", {"r": 0.3, "k": 10, "alpha": 0.4}, "p70", 36),
    "full": ("full", {}, "e36", 36),
    "e72-seta-p30": ("seta", {"r": 0.0, "k": 5, "alpha": 0.7}, "p30", 72),
    "e72-seta-p50": ("seta", {"r": 0.1, "k": 5, "alpha": 0.6}, "p50", 72),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from studies.quality.layout import Layout

    p = argparse.ArgumentParser(prog="python -m studies.quality.collapse", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", choices=sorted(RUNS), required=True)
    p.add_argument("--until", type=int, required=True, help="last epoch trained (the schedule stays that of E)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drop-below", type=int, default=0, help="do not train a final batch of fewer samples")
    p.add_argument("--no-forks", action="store_true", help="no forked evaluations (the run only)")
    p.add_argument("--fork-epochs", help="comma-separated epochs to fork at (default: every epoch)")
    p.add_argument("--param", action="append", default=[], help="extra policy parameter name=value (JSON value)")
    p.add_argument("--tag", default="", help="appended to the result file's name")
    p.add_argument("--data", default=str(Layout().data))
    p.add_argument("--out", default=str(Layout().out))
    p.add_argument("--results", default=str(Layout().results / "collapse-experiments"))
    return p.parse_args(argv)


def experiment(args: argparse.Namespace) -> tuple[dict, str]:
    """The configuration the experiment ``args`` trains, and its id (its result file's name without .json)."""
    from studies.quality.configs import conv_cfg, conv_run_id

    policy, params, label, E = RUNS[args.run]
    params = dict(params)
    for item in args.param:
        name, _, value = item.partition("=")
        params[name] = json.loads(value)
    cfg = conv_cfg(E, policy, params, label)
    return cfg, f"collapse-{conv_run_id(cfg, args.seed)}-until{args.until}{args.tag}"


def main(argv: list[str] | None = None) -> None:
    import torch

    from seta_stream import list_samples
    from studies.quality.data import Cifar
    from studies.quality.layout import Layout
    from studies.quality.train import resume_path, train_run
    from tools.results import write_json

    args = parse(argv)
    torch.set_num_threads(1)
    layout = Layout(data=Path(args.data), out=Path(args.out))
    cfg, rid = experiment(args)
    ds = Cifar(layout.data, layout.out)
    ds.prepare()
    population = list_samples(ds.train)
    fork_epochs = {int(e) for e in args.fork_epochs.split(",")} if args.fork_epochs else None
    probe = Probe(ds.batch, drop_below=args.drop_below, forks=not args.no_forks, fork_epochs=fork_epochs)
    runs = layout.out / "collapse-runs"
    resume_path(runs, rid).unlink(missing_ok=True)  # every experiment starts afresh
    result = train_run(
        ds, cfg, args.seed, runs, population, rid, until=args.until, probe=probe, nominal_batch=False
    )  # the collapsed runs' loop (module docstring)
    result["experiment"] = {
        "run": args.run,
        "until": args.until,
        "drop_below": args.drop_below,
        "forks": not args.no_forks,
        "fork_epochs": sorted(fork_epochs) if fork_epochs is not None else "all",
        "sizes": list(SIZES),
        "skipped_final_batches": probe.skipped,
        # every path as the repository names it (or <elsewhere>/NAME): no folder of this machine
        "command": "python -m studies.quality.collapse "
        + " ".join(argv_labels(list(argv if argv is not None else sys.argv[1:]))),
    }
    resume_path(runs, rid).unlink(missing_ok=True)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{rid}.json", result)  # whole (a temp file, then a rename)
    print(f"-> {out / (rid + '.json')}", flush=True)


if __name__ == "__main__":
    main()

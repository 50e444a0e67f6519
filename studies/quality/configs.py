"""Which runs each study makes, the id of each run (its file and run-directory name), and their order."""

from __future__ import annotations

from studies.quality.calibrate import LEVELS

# ----------------------------------------------------------------------------- the short study
DEFAULT_ORDER = "cifar10:0,sst2:0-1,cifar10:1,sst2:2-4"
FULL = {"policy": "full", "params": {}, "label": "full", "noisy": False}


def params_id(params: dict) -> str:
    """The parameters' part of a run id, e.g. ``alpha0.7-k10-r0.1`` (``default`` for none)."""
    return "-".join(f"{k}{v}" for k, v in sorted(params.items())) or "default"


def run_id(ds: str, cfg: dict, seed: int) -> str:
    """The short study's id, e.g. ``cifar10-clean-seta-p30-alpha0.7-k10-r0.1-s0``."""
    noisy = "noisy" if cfg["noisy"] else "clean"
    return f"{ds}-{noisy}-{cfg['policy']}-{cfg['label']}-{params_id(cfg['params'])}-s{seed}"


def configs(calibration: dict | None) -> list[dict]:
    """The short study's runs: every policy at every level, then the noisy-label runs: full data, ES,
    ESWP, and InfoBatch and SeTa at their 50% settings (the latter two only once ``calibration`` exists)."""
    out: list[dict] = [dict(FULL)]
    for policy in ("random", "static"):
        out += [{"policy": policy, "params": {"r": lv}, "label": f"p{int(lv * 100)}", "noisy": False} for lv in LEVELS]
    noisy = [dict(FULL)]
    for policy in ("infobatch", "seta") if calibration is not None else ():
        levels = calibration["levels"][policy]
        chosen: list[dict] = []
        for lv in LEVELS:
            p = levels[f"{int(lv * 100)}"]["params"]
            if p not in chosen:  # e.g. InfoBatch's largest r serves two levels: one run, not two
                chosen.append(p)
                out.append({"policy": policy, "params": p, "label": f"p{int(lv * 100)}", "noisy": False})
        noisy += [c for c in out if c["policy"] == policy and c["params"] == levels["50"]["params"]]
    es = [{"policy": p, "params": {}, "label": "default", "noisy": False} for p in ("es", "eswp")]
    return out + es + [{**c, "noisy": True} for c in noisy + es]


# ------------------------------------------------------------ the noise rule on noisy labels
NOISE_RULE = {"noise": True}  # the noise rule at its defaults (issue 26): the rule alone is full with it
NOISE_LABEL_FULL = {"policy": "full", "params": {}, "label": "nz-full", "noisy": True}


def noise_label_configs(calibration: dict | None, rule_random: dict | None) -> list[dict]:
    """The noise study's runs on 40% noisy labels (``studies/noise_study.py``), labelled
    ``nz-...`` so that their ids and files are their own: full data, the rule alone (on the loss
    and on the log1p scale, docs/algorithms.md §12.11), the rule with
    dynamic random near 50% (``rule_random``: its parameters, chosen on training losses; left out
    until known), dynamic random at 50%, SeTa and InfoBatch at their 50% settings of the short
    study's ``calibration`` (the settings its noisy-label runs use; left out without one)."""
    nz = dict(NOISE_LABEL_FULL)
    out = [nz, {**nz, "params": dict(NOISE_RULE), "label": "nz-rule"},
           {**nz, "params": {**NOISE_RULE, "noise_scale": "log1p"}, "label": "nz-rule-log1p"}]  # fmt: skip
    if rule_random is not None:
        out.append({**nz, "policy": "random", "params": dict(rule_random), "label": "nz-rule-p50"})
    out.append({**nz, "policy": "random", "params": {"r": 0.5}, "label": "nz-p50"})
    for policy in ("seta", "infobatch") if calibration is not None else ():
        out.append({**nz, "policy": policy, "params": calibration["levels"][policy]["50"]["params"], "label": "nz-p50"})
    return out


NOISE_LONG_E = 20  # the long noisy-label schedule: the converged study's noaug-E20 (docs/quality.md)


def noise_label_long_configs() -> list[dict]:
    """The noise study's long schedule on CIFAR-10 with 40% noisy labels: 20 epochs without
    augmentation (the converged study's ``noaug-E20`` schedule on clean labels), long enough for
    full data to fit the noisy labels, with the test accuracy after every epoch (``curve``): full
    data and the rule alone on both scales. The short schedule's 6 epochs end one epoch after the
    rule's first suspects, before full data has begun to fit the noisy labels."""
    nz = {**NOISE_LABEL_FULL, "n_epochs": NOISE_LONG_E, "augment": False, "curve": True}
    tag = f"noaug-E{NOISE_LONG_E}"
    return [{**nz, "label": f"nz-{tag}"}, {**nz, "params": dict(NOISE_RULE), "label": f"nz-rule-{tag}"},
            {**nz, "params": {**NOISE_RULE, "noise_scale": "log1p"}, "label": f"nz-rule-log1p-{tag}"}]  # fmt: skip


def parse_order(spec: str, datasets: list[str]) -> list[tuple[str, list[int]]]:
    """'cifar10:0,sst2:0-1' -> [('cifar10', [0]), ('sst2', [0, 1])], keeping only ``datasets``."""
    out = []
    for item in spec.split(","):
        name, _, seeds = item.partition(":")
        lo, _, hi = seeds.partition("-")
        if name in datasets:
            out.append((name, list(range(int(lo), int(hi or lo) + 1))))
    return out


# ------------------------------------------------------------------------- the converged study
CONVERGED_E = 36  # chosen so that a full run stays under ~15 min here; docs/quality.md reports the 2E check
CONVERGED_SEEDS = 2


def conv_tag(E: int, augment: bool = True, model: str = "cnn") -> str:
    """The part of a run id naming the study's schedule: ``E36``, ``noaug-E20`` without
    augmentation, ``resnet18-E30`` for another model than the small CNN."""
    tag = f"E{E}" if augment else f"noaug-E{E}"
    return tag if model == "cnn" else f"{model}-{tag}"


def conv_cfg(E: int, policy: str, params: dict, label: str, n_epochs: int | None = None, augment: bool = True,
             model: str = "cnn") -> dict:  # fmt: skip
    """A converged-study run; ``augment=False`` trains without the crop-and-flip augmentation,
    ``model`` names the network (``models.IMAGE_MODELS``). Each key is left out at its default, so
    the configurations and ids of the small CNN's augmented studies are unchanged."""
    cfg = {"policy": policy, "params": params, "label": label, "noisy": False, "study": "converged",
           "E": E, "n_epochs": n_epochs or E}  # fmt: skip
    return {**cfg, **({} if augment else {"augment": False}), **({} if model == "cnn" else {"model": model})}


def augments(cfg: dict) -> bool:
    """Whether the run ``cfg`` (a configuration or a result) trains with augmentation."""
    return bool(cfg.get("augment", True))


def model_of(cfg: dict) -> str:
    """The network the run ``cfg`` (a configuration or a result) trains."""
    return str(cfg.get("model", "cnn"))


def conv_full(E: int, n: int, augment: bool = True, model: str = "cnn") -> dict:
    """Full data trained for n epochs (the lr schedule's shape compressed to n) in the study at E."""
    return conv_cfg(E, "full", {}, f"e{n}", n, augment, model)


def conv_run_id(cfg: dict, seed: int) -> str:
    """The converged study's id, e.g. ``cifar10-E36-full-e25-default-s0``, ``cifar10-noaug-E20-random-p30-r0.3-s1``."""
    tag = conv_tag(cfg["E"], augments(cfg), model_of(cfg))
    return f"cifar10-{tag}-{cfg['policy']}-{cfg['label']}-{params_id(cfg['params'])}-s{seed}"


def conv_calibration_name(E: int, augment: bool = True, model: str = "cnn") -> str:
    return f"cifar10-{conv_tag(E, augment, model)}-calibration.json"


def conv_pruned(E: int, cal: dict, augment: bool = True, model: str = "cnn") -> list[dict]:
    """Pruned runs at E in the order they are most informative: SeTa and dynamic random side by
    side at 30/50/70%, InfoBatch near 30%, SeTa with target_keep 0.5 (its 50% setting's r, k, alpha)."""
    seta = cal["levels"]["seta"]
    tk = dict(seta["50"]["params"])
    tk["target_keep"] = min(0.5, round(1 - tk.get("r", 0.0), 6))
    runs = []
    for lv in ("30", "50", "70"):
        runs += [("seta", seta[lv]["params"], f"p{lv}"), ("random", {"r": int(lv) / 100}, f"p{lv}")]
    runs += [("infobatch", cal["levels"]["infobatch"]["30"]["params"], "p30"), ("seta", tk, "p50tk")]
    return [conv_cfg(E, policy, params, label, augment=augment, model=model) for policy, params, label in runs]


def equal_compute_epochs(E: int, pruned: list[float]) -> list[int]:
    """round(E (1 - p)) for each measured pruned fraction p, distinct, longest first, E itself left out."""
    return sorted({round(E * (1 - p)) for p in pruned} - {E, 0}, reverse=True)


def converged_plan(E: int, seeds: int, cal: dict | None, measured: list[float],
                   augment: bool = True, model: str = "cnn") -> list[tuple[dict, int]]:  # fmt: skip
    """Every run of the converged study known so far, in run order, seed by seed.

    Per seed: full data at E (seed 0 also at 2E: the convergence check), the pruned runs (known
    once ``cal``, the calibration on seed 0's full run, exists), then full data at equal compute
    for each pruned fraction seed 0 measured so far (``measured``). Later seeds run 2E last, once
    everything else of theirs is in: the check on a second seed.
    """
    plan: list[tuple[dict, int]] = []
    for seed in range(seeds):
        plan.append((conv_full(E, E, augment, model), seed))
        if seed == 0:
            plan.append((conv_full(E, 2 * E, augment, model), 0))
        if cal is None:
            continue
        plan += [(c, seed) for c in conv_pruned(E, cal, augment, model)]
        plan += [(conv_full(E, n, augment, model), seed) for n in equal_compute_epochs(E, measured)]
        if seed > 0:
            plan.append((conv_full(E, 2 * E, augment, model), seed))
    return plan

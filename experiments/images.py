"""Images as sequences: the digits ViT (configs/digits_vit.toml) over seeds, and its figure.

    python experiments/images.py             # train what is missing, print the table
    python experiments/images.py --table     # ... and rewrite its table in docs/studies.md
    python experiments/images.py --budget 0 --table   # rewrite it, train nothing

Each seed (0, 1, 2: ``train.seed``, the initialisation and the order and shifts of the
training images) is ``train.py configs/digits_vit.toml train.seed=S``, trained by the process
pool of ``experiments/sweep.py`` pinned to one core; its result is
``experiments/results/images/digits_vit-seedS.json`` keyed by a hash of the config, so a rerun
trains only what is missing or whose config changed. Test accuracy is over the 360 held-out
images (:mod:`tfmjax.data.images`); the figure (``docs/images_digits.png``) draws each seed's
test-accuracy curve and the class token's attention to the patches of one test image.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep import (  # noqa: E402
    ROOT,
    Run,
    is_current,
    runs_dir,
    save,
    spread,
    train_missing,
    train_options,
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "images"
FIGURE = ROOT / "docs" / "images_digits.png"
CONFIG = "configs/digits_vit.toml"
SEEDS = (0, 1, 2)
BEGIN, END = "<!-- images-table -->", "<!-- /images-table -->"


def result_path(seed: int, results: Path = RESULTS) -> Path:
    return results / f"digits_vit-seed{seed}.json"


def overrides_of(seed: int, extra=()) -> list[str]:
    return [f"train.seed={seed}", *extra]


def stored(seeds, extra=(), results: Path = RESULTS) -> list[dict]:
    return [
        json.loads(result_path(s, results).read_text())
        for s in seeds
        if is_current(result_path(s, results), CONFIG, overrides_of(s, extra))
    ]


def table(seeds, extra=(), results: Path = RESULTS) -> str:
    records = stored(seeds, extra, results)
    lines = [
        "| config | seeds | test accuracy | per seed | test loss | wall s per seed | params |",
        "| --- | ---: | --- | --- | --- | --- | ---: |",
    ]
    if records:
        acc = [r["accuracy"] for r in records]
        per_seed = " / ".join(f"{a:.3f}" for a in acc)
        walls = " / ".join(f"{r['wall_sec']:.0f}" for r in records)
        lines.append(
            f"| `{CONFIG}` | {len(records)} | {spread(acc)} | {per_seed} | "
            f"{spread([r['loss'] for r in records])} | {walls} | {records[0]['params']:,} |"
        )
    return "\n".join(lines)


def figure(records: list[dict], workdir: Path | None, path: Path = FIGURE) -> None:
    """Test accuracy per eval step for each seed, and (from ``workdir``'s last checkpoint) the
    class token's attention over the grid of patches of the first test image, per head of
    the last layer, beside the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    heads = _cls_attention(workdir) if workdir is not None and workdir.is_dir() else None
    ncols = 2 + (len(heads[1]) if heads else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(3.2 * ncols, 3.0))
    ax = axes[0]
    for r in records:
        curve = r["curve"]
        ax.plot([c["step"] for c in curve], [c["accuracy"] for c in curve], marker="o")
    ax.set(xlabel="step", ylabel="test accuracy (360 images)", ylim=(0.8, 1.0))
    ax.axhline(0.97, color="grey", lw=0.8, ls="--")
    ax.set_title("digits ViT, seeds " + ", ".join(str(r["seed"]) for r in records))
    if heads:
        image, grids = heads
        axes[1].imshow(image, cmap="gray_r")
        axes[1].set_title("test image 0")
        for n, grid in enumerate(grids):
            axes[2 + n].imshow(np.asarray(grid), cmap="viridis")
            axes[2 + n].set_title(f"last layer, head {n}: cls -> patches")
    else:
        axes[1].axis("off")
    for ax in axes[1:]:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cls_attention(workdir: Path):
    """``(image [8,8], [N] grids [4,4])``: the last layer's attention of the class token on
    each patch (its own slot left out) for the first test image."""
    import numpy as np

    import tfmjax
    from tfmjax.interp.hooked import run_with_cache

    m = tfmjax.load(workdir)
    images, _ = m.source.split_arrays("eval")
    row = {"images": images[:1]}
    last = m.config.model.num_layers - 1
    name = f"encoder.blocks.{last}.attn.hook_pattern"
    _, cache = run_with_cache(m.model, m.params, row, names=[name])
    pattern = np.asarray(cache[name][0])  # [N, T, S]
    side = m.config.model.image_size // m.config.model.patch_size
    grids = [pattern[n, 0, 1:].reshape(side, side).tolist() for n in range(pattern.shape[0])]
    return images[0, ..., 0], grids


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, ["digits_vit"])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = Path(args.results) if args.results else RESULTS
    root = runs_dir(args.results)

    def run_of(seed: int) -> Run:
        overrides = tuple(overrides_of(seed, args.extra))
        return Run(
            "images", f"digits_vit-seed{seed}", f"digits_vit seed {seed}", CONFIG, overrides, root
        )

    missing = [
        s
        for s in seeds
        if not is_current(result_path(s, results), CONFIG, overrides_of(s, args.extra))
    ]
    seed_of = {run_of(s).name: s for s in missing}

    def on_result(run: Run, record: dict) -> None:
        seed = seed_of[run.name]
        save(result_path(seed, results), {**record, "seed": seed})

    code = train_missing([run_of(s) for s in missing], on_result, **train_options(args))
    print(table(seeds, args.extra, results))
    if args.table and not args.results:
        write_table(BEGIN, END, table(seeds, args.extra))
        figure(stored(seeds, args.extra), run_of(seeds[0]).workdir)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

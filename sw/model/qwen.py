"""Qwen2.5-1.5B at full dimension (issue #35 item 1): the model named ``qwen2.5-1.5b`` on
command lines.

* :data:`QWEN_NAME` resolves to a random-weight bf16 checkpoint of
  :data:`mcf.model.QWEN25_1P5B_MODEL` (Qwen2.5-1.5B-Instruct's published ``config.json``: hidden
  1,536, 28 layers, 12 / 2 heads of 128, intermediate 8,960, θ = 10⁶, tied embeddings,
  vocabulary 151,936) written by :func:`mcf.model.checkpoint.write_random_checkpoint` from
  :data:`QWEN_SEED` into ``<build>/models/qwen2.5-1.5b-random-s<seed>/`` (``<build>`` is
  ``$MCF_BUILD_DIR`` or ``./build``; never committed) on first use. The whole model is 3.1 GB
  (the embedding alone 0.47 GB, each layer 94 MB); asking for ``K`` layers writes only the
  embedding and the first ``K`` layers (the config still says 28), and asking for more later
  adds the missing ones. ``scripts/make_qwen_checkpoint.py`` writes it by hand.
* :func:`resolve_model` turns ``--model`` / ``--checkpoint`` / ``--layers`` into the one
  model spec string a run carries (:func:`mcf.model.checkpoint.join_spec`); a ``--checkpoint``
  folder (a real downloaded Qwen2.5-1.5B or -Instruct) must have the geometry.

``--layers K`` truncates the model: the embedding, its first ``K`` layers, the final norm and
the lm_head (:func:`mcf.model.checkpoint.truncate`), in the float reference and the integer
golden model alike. For K < 28 the later layers are not run anywhere, so a real checkpoint's
tokens are not the model's; the run checks the RTL against the golden model of the same
truncated model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .checkpoint import join_spec, read_config, write_random_checkpoint
from .config import QWEN25_1P5B_MODEL, CheckpointError, Qwen2Config

__all__ = ["QWEN_NAME", "QWEN_SEED", "random_qwen_dir", "random_qwen", "check_qwen_geometry",
           "resolve_model", "MODEL_NAMES"]

QWEN_NAME = "qwen2.5-1.5b"
QWEN_SEED = 0
"""The seed of the random-weight checkpoint ``qwen2.5-1.5b`` names."""
MODEL_NAMES = ("tiny", "retrieval", QWEN_NAME)
"""Models named on command lines (anything else is a checkpoint directory)."""


def _build_root() -> Path:
    # mcf.hdl.convert.build_root's rule, without importing amaranth on the host-only path
    return Path(os.environ.get("MCF_BUILD_DIR", Path.cwd() / "build"))


def random_qwen_dir(seed: int = QWEN_SEED, root: Path | None = None) -> Path:
    """Where the random-weight checkpoint of ``seed`` lives."""
    return Path(root or _build_root()) / "models" / f"{QWEN_NAME}-random-s{seed}"


def _stderr(msg: str) -> None:
    print(f"{QWEN_NAME}: {msg}", file=sys.stderr, flush=True)


def random_qwen(layers: int | None = None, seed: int = QWEN_SEED, root: Path | None = None,
                progress: Callable[[str], None] | None = _stderr) -> Path:
    """The random-weight Qwen2.5-1.5B checkpoint holding at least its first ``layers`` layers
    (default all 28), written or extended on first use (``progress`` told of each part; about
    10 s CPU for the embedding and 1.5 s per layer, 2.8 GB peak). Returns its directory."""
    d = random_qwen_dir(seed, root)
    try:
        n = QWEN25_1P5B_MODEL.truncated(
            QWEN25_1P5B_MODEL.num_hidden_layers if layers is None else layers)
    except CheckpointError as e:
        raise CheckpointError(f"{QWEN_NAME}: {e}") from None
    written = write_random_checkpoint(d, QWEN25_1P5B_MODEL, seed, n.num_hidden_layers,
                                      progress=progress)
    if progress and written:
        progress(f"wrote {len(written) - 2} part(s): {d} holds layers 0..{n.num_hidden_layers - 1}"
                 f" of {QWEN25_1P5B_MODEL.num_hidden_layers} at least")
    return d


def check_qwen_geometry(cfg: Qwen2Config, where: str = "") -> None:
    """Raise :class:`CheckpointError` unless ``cfg`` is Qwen2.5-1.5B's model (any
    ``max_position_embeddings``: the base model says 131,072, the Instruct model 32,768)."""
    want = QWEN25_1P5B_MODEL
    got = replace(cfg, max_position_embeddings=want.max_position_embeddings)
    if got != want:
        diff = [f"{k} {getattr(cfg, k)} (expected {getattr(want, k)})"
                for k in want.__dataclass_fields__ if getattr(got, k) != getattr(want, k)]
        raise CheckpointError(f"{where}not Qwen2.5-1.5B: " + ", ".join(diff))


def resolve_model(model: str, checkpoint: str | None = None, layers: int | None = None,
                  progress: Callable[[str], None] | None = _stderr) -> str:
    """The model spec a run carries for ``--model model [--checkpoint DIR] [--layers K]``:
    ``qwen2.5-1.5b`` is ``DIR`` (its config checked to be Qwen2.5-1.5B's) or the random-weight
    checkpoint's folder (written now if missing, so every process of the run finds it; an
    absolute path, as is ``DIR``, since those processes may run in other folders); ``K``
    becomes a ``:layers=K`` suffix. Arguments are checked before anything is written. Raises
    :class:`CheckpointError` with one line."""
    if checkpoint is not None and model != QWEN_NAME:
        raise CheckpointError(f"--checkpoint names the folder of --model {QWEN_NAME}; for "
                              f"another checkpoint give its folder as --model")
    if layers is not None and model == "tiny":
        raise CheckpointError("--layers: the tiny model is drawn from --seed with its 2 layers; "
                              "truncate a checkpoint (--model DIR or qwen2.5-1.5b) instead")
    if model == QWEN_NAME:
        if checkpoint is not None:
            full = read_config(checkpoint)
            check_qwen_geometry(full, f"--checkpoint {checkpoint}: ")
            base = str(Path(checkpoint).resolve())
        else:
            base, full = None, QWEN25_1P5B_MODEL
    elif model in MODEL_NAMES:
        base, full = model, None
    else:
        base, full = str(Path(model).resolve()), read_config(model)
    if layers is not None and full is not None and \
            not 1 <= layers <= full.num_hidden_layers:
        raise CheckpointError(f"--layers {layers}: the model has 1..{full.num_hidden_layers} "
                              "layers")
    if base is None:        # the folder's absolute path: simulator and MPI processes run elsewhere
        base = str(random_qwen(layers, progress=progress).resolve())
    return join_spec(base, layers)

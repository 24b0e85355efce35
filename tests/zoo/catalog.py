"""What is in the zoo: each public script's source (repository, commit, path, licence, sha256)
and how it is run small (its own flags, the data we generate for it).

The scripts themselves are not in this repository (see README.md, "Where the scripts live"):
they are looked for under ZOO_SCRIPTS (default tests/zoo/scripts/), one folder per entry laid
out as in its repository, and each file must match the sha256 pinned here byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datagen

ZOO = Path(__file__).resolve().parent
SCRIPTS = Path(os.environ.get("ZOO_SCRIPTS", str(ZOO / "scripts")))

NANOGPT = ("karpathy/nanoGPT", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291", "MIT")
EXAMPLES = ("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")
LIGHTNING = ("Lightning-AI/pytorch-lightning", "7f0c3436cd3f6ad3753125672024fc415cbcb414", "Apache-2.0")


@dataclass(frozen=True)
class Source:
    """One published file, copied unmodified to `dest` (relative to the entry's folder)."""

    repo: tuple[str, str, str]  # (owner/name, commit, licence)
    path: str  # path in the repository
    dest: str
    sha256: str

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo[0]}/blob/{self.repo[1]}/{self.path}"


@dataclass(frozen=True)
class Entry:
    """One zoo member: its files, the command line that shrinks it, its data and what it does."""

    name: str
    sources: tuple[Source, ...]
    script: str  # the file run, relative to the entry's folder (also the working directory)
    args: tuple[str, ...]
    prepare: Callable[[Path], None] = lambda workdir: None
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1  # > 1: run under torchrun with this many processes
    probe_step: int = 0  # sitecustomize probes pickle/deepcopy after this optimizer step (0: never)
    checkpoints: tuple[str, ...] = ()  # files the script saves, relative to its working directory
    byte_identical: tuple[str, ...] = ()  # those of them that must equal the plain run's bytes
    # What the script does, counted from its own code and flags (None: not pinned down here):
    micro_batches: int | None = 1  # forward+backward passes per optimizer step
    evals: int | None = None  # evaluation passes (each should be one train.eval span)
    saves_and_loads: int | None = None  # checkpoint saves + loads (each one train.checkpoint span)
    manual_update: bool = False  # updates weights by hand: no optimizer, no optimizer hook to count
    seeded: bool = True  # seeds its RNGs: a plain and an instrumented run compute the same weights
    home: Path | None = None  # where its files are, when not under SCRIPTS (an installed package)

    @property
    def folder(self) -> Path:
        return self.home if self.home is not None else SCRIPTS / self.name


def _nanogpt_data(workdir: Path) -> None:
    datagen.nanogpt(workdir)


NANOGPT_ARGS = ("--dataset=zoo", "--device=cpu", "--compile=False", "--dtype=float32", "--batch_size=4",
                "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32", "--max_iters=12",
                "--eval_interval=4", "--eval_iters=2", "--gradient_accumulation_steps=2", "--log_interval=1",
                "--warmup_iters=2", "--lr_decay_iters=12", "--out_dir=out")
NANOGPT_GRAD_ACCUM = 2
NANOGPT_STEPS = 13  # iterations 0..max_iters: the loop breaks once iter_num > max_iters
NANOGPT_EVALS = 4  # estimate_loss() at iterations 0, 4, 8, 12 (before that iteration's step)
NANOGPT_SAVES = 3  # ckpt.pt after the evals at 4, 8, 12 (never at iteration 0)

WORD_LM_ARGS = ("--data", "wikitext", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--bptt", "8",
                "--batch_size", "4", "--epochs", "1", "--log-interval", "5", "--save", "model.pt")


def _word_lm_data(workdir: Path) -> None:
    datagen.wikitext(workdir / "wikitext")


def word_lm_steps() -> int:
    """word_language_model updates the weights by hand (no optimizer), so the independent count
    is its own loop arithmetic on the data we generate."""
    return datagen.word_lm_batches(datagen.wikitext_train_tokens(), batch_size=4, bptt=8, epochs=1)


PPO_ARGS = ("--total-timesteps", "128", "--num-envs", "2", "--num-steps", "16", "--update-epochs", "2",
            "--per-rank-batch-size", "16")
PPO_STEPS_PER_RANK = 8  # 128 // (2 envs * 16 steps * 2 ranks) = 2 updates, 2 epochs x 2 batches each

ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry(
        name="nanogpt",
        sources=(
            Source(NANOGPT, "train.py", "train.py", "413bd97b40bb400a2a0d01230e2946f056c263ebac1b7281c2367d964a123085"),
            Source(NANOGPT, "model.py", "model.py", "7c01703240dbec5d554527dc666e35b3df8391d0b117fddc07afcf325a21d11c"),
            Source(NANOGPT, "configurator.py", "configurator.py",
                   "5cc23aca26b4ab3c0d9e5f82740f4781f9444f42718c15abcee70d93c5aabe8f"),
        ),
        script="train.py", args=NANOGPT_ARGS, prepare=_nanogpt_data, probe_step=6,
        checkpoints=("out/ckpt.pt",), byte_identical=("out/ckpt.pt",),
        micro_batches=NANOGPT_GRAD_ACCUM, evals=NANOGPT_EVALS, saves_and_loads=NANOGPT_SAVES),
    Entry(
        name="word_language_model",
        sources=(
            Source(EXAMPLES, "word_language_model/main.py", "main.py",
                   "391de12bb7c6e07dbb105d47d017632bf80c01d2e5b25adbf83da9cdcdd5a862"),
            Source(EXAMPLES, "word_language_model/model.py", "model.py",
                   "e4451a33e9b16953004bc639d736d14f42a2b21f2939ccabe4cff10d3c40b74c"),
            Source(EXAMPLES, "word_language_model/data.py", "data.py",
                   "15784815a6bd18e9b25eadf6ae049915f88d4fb8faebeba9d83ae6ec8e19883d"),
        ),
        script="main.py", args=WORD_LM_ARGS, prepare=_word_lm_data,
        checkpoints=("model.pt",), byte_identical=("model.pt",),
        # one epoch: evaluate(val) then, after loading the best model back, evaluate(test);
        # torch.save(model) once (the first validation loss is the best yet), torch.load once:
        # a load is no train.checkpoint span (docs/step-semantics.md: scripts load data files
        # with torch.load too), so one span.
        evals=2, saves_and_loads=1, manual_update=True),
    Entry(
        name="time_sequence_prediction",
        sources=(
            Source(EXAMPLES, "time_sequence_prediction/train.py", "train.py",
                   "3a5d6603cecf7bbf76f96a515dc6c9377849adeefe783edaf6f661bd02e80330"),
        ),
        # The script torch.load()s a numpy array; since torch 2.6 that needs weights_only=False,
        # which torch's own switch gives without touching the script.
        script="train.py", args=("--steps", "3"), prepare=datagen.sine_waves,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}, probe_step=3,
        # forward/backward run inside optimizer.step(closure), as often as LBFGS calls it;
        # after each step a prediction under torch.no_grad() (an evaluation pass).
        micro_batches=None, evals=3, saves_and_loads=0),
    Entry(
        name="lightning_bug_report",
        sources=(
            Source(LIGHTNING, "examples/pytorch/bug_report/bug_report_model.py", "bug_report_model.py",
                   "5b40c80c42efd713000d6c4a4b3aaeafea0cb3ccea792edebf583fc1a64863b0"),
        ),
        script="bug_report_model.py", args=(), probe_step=1, seeded=False,
        checkpoints=("lightning_logs/version_0/checkpoints/epoch=0-step=1.ckpt",),
        # fit: one step, validation, ModelCheckpoint's save; then trainer.test(): a second pass.
        evals=2, saves_and_loads=1),
    Entry(
        name="ppo_ddp",
        sources=(
            Source(LIGHTNING, "examples/fabric/reinforcement_learning/train_torch.py", "train_torch.py",
                   "2d8e0f019c2c686f7f932f06f4b04d5a59ae9db0e2f0ff2c096f20239aae9139"),
            Source(LIGHTNING, "examples/fabric/reinforcement_learning/rl/__init__.py", "rl/__init__.py",
                   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            Source(LIGHTNING, "examples/fabric/reinforcement_learning/rl/agent.py", "rl/agent.py",
                   "aa1cc857a9aae7520d67883a9ba1607ec4e65e5e366cfd79192261d67a9c5c7e"),
            Source(LIGHTNING, "examples/fabric/reinforcement_learning/rl/loss.py", "rl/loss.py",
                   "4b50486fe89d5d273f77413497abdd11ccfeff309566bdbd3d30e3c0afdc34e4"),
            Source(LIGHTNING, "examples/fabric/reinforcement_learning/rl/utils.py", "rl/utils.py",
                   "8c70650871700e9b9da220cc257848c96856a67ffa991ac0e9cf1a8377f60470"),
        ),
        script="train_torch.py", args=PPO_ARGS, ranks=2),
)}


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


ACCELERATE = ("huggingface/accelerate", "v1.15.0", "Apache-2.0")
_ACCELERATE_DIR = _package_dir("accelerate")

#: Public scripts that ship inside installed packages (the `hf` extra): always at hand, so CI
#: runs them (tests/test_zoo_packaged.py). Each is run from a copy of the installed file, which
#: must be the pinned one (another accelerate version skips it).
PACKAGED: dict[str, Entry] = {e.name: e for e in (
    Entry(
        name="accelerate_test_script",
        sources=(
            Source(ACCELERATE, "src/accelerate/test_utils/scripts/test_script.py", "test_script.py",
                   "698b0b4250a6d1ac7facb381a9e55a71ab9a0b179f8e0bac3ce38d8a2c275c92"),
        ),
        # accelerate's own end-to-end check on one CPU process: DataLoader loops with
        # `model.zero_grad()` at the top of each iteration, plain and through Accelerator
        # (fp32, batch split, bf16), twice; it asserts the trained weights match, so exit 0
        # also says the instrumentation changed no number. No evaluation pass, no checkpoint.
        script="test_script.py", args=(), env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        evals=0, saves_and_loads=0,
        home=_ACCELERATE_DIR / "test_utils" / "scripts" if _ACCELERATE_DIR is not None else None),
)}

#: Licence texts, kept beside the scripts (ZOO_SCRIPTS/LICENSES/).
LICENCE_FILES = {
    NANOGPT[0]: "LICENSES/nanoGPT-MIT.txt",
    EXAMPLES[0]: "LICENSES/pytorch-examples-BSD-3-Clause.txt",
    LIGHTNING[0]: "LICENSES/lightning-Apache-2.0.txt",
}


def missing(entry: Entry) -> list[str]:
    """Files of `entry` absent from SCRIPTS or not byte-for-byte the pinned ones (empty: all good)."""
    problems = []
    for src in entry.sources:
        path = entry.folder / src.dest
        if not path.is_file():
            problems.append(f"{path}: absent ({src.url})")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != src.sha256:
            problems.append(f"{path}: not the published file (sha256 differs from {src.url})")
    return problems

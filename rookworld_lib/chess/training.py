"""The chess tasks on the core's trainers: a model's text layout (recorded in its export), SFT's reader
of P:/A: records, GRPO's prompts and reward function, and the `rookworld sft` / `rookworld grpo` commands.

The core trains on text and reward functions; this module is where chess meets it: records are
rendered in the model's layout (tasks.LAYOUTS), the layout goes into the export's config.json
(LAYOUT_KEY, through GPT.meta), and GRPO scores completions with rewards.score and the records' truth.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from ..core import distributed, grpo
from ..core.config import add_config_arguments, config_kwargs_from_args, path_arg
from ..core.model import GPT, PROMPT_PREFIX_KEY, CheckpointFormatError, config_from_hf, read_config_json
from ..core.paths import DataFormatError, json_lines
from ..core.train_grpo import METRICS_FILE as GRPO_METRICS_FILE
from ..core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem, check_world_size
from ..core.trainer import FINAL_DIR
from ..core.train_sft import METRICS_FILE, SFTConfig, TextReader, train_sft
from ..core.task_vocab import TaskVocab, outside_logmass
from ..core.tokenizer import EOT_ID, encode_prompt, get_tokenizer
from ..core.train_utils import read_metrics, setup_runtime
from . import data, engine, rewards, tasks
from .datagen import heldout_positions

log = logging.getLogger(__name__)

# The config.json key of the layout a model reads and writes (GPT.meta). A GPT-2 directory with neither
# it nor PROMPT_PREFIX_KEY is an original RookWorld model: the original fixed-width layout.
LAYOUT_KEY = "rookworld_layout"
# The config.json key of the order in which SFT wrote the P: candidates, when not the layout's own.
ORDER_KEY = "rookworld_candidate_order"
# "layout": the layout's own (compact: Stockfish's, best first; original: shuffled, as the original
# data); "uci": sorted by move text, which breaks the greedy loop on the best candidate
# (docs/grpo.md, section 4).
CANDIDATE_ORDERS = ("layout", "uci")
POLICY_FRACTION = 0.5  # every profile's and command's share of P: samples and prompts (the rest A:)


def task_weights(policy_fraction: float | None = POLICY_FRACTION) -> dict[str, float] | None:
    """The core's task_weights (SFTConfig, GRPOTrainConfig) for a share of P: samples or prompts, the rest
    A:; None: SFT keeps the data's own mix and GRPO draws from all prompts as one pool."""
    if policy_fraction is None:
        return None
    if isinstance(policy_fraction, bool) or not isinstance(policy_fraction, (int, float)) or not 0 <= policy_fraction <= 1:
        raise ValueError(f"policy_fraction (--policy-fraction) must be a number in [0, 1] or None, got {policy_fraction!r}")
    return {"P": float(policy_fraction), "A": 1.0 - policy_fraction}


# -- a model's layout ------------------------------------------------------------------------------

def _layout_of(d: dict, where) -> tuple[str, str]:
    if d.get(ORDER_KEY, "layout") not in CANDIDATE_ORDERS:  # a model's records are checked where it is read
        raise CheckpointFormatError(f"{where}: {ORDER_KEY} is {d[ORDER_KEY]!r}, expected one of {CANDIDATE_ORDERS}")
    if LAYOUT_KEY not in d:
        if d.get(PROMPT_PREFIX_KEY):  # our SFT's models (EOT before every prompt): the compact layout
            return "compact", f"{where} records no {LAYOUT_KEY!r} but a prompt prefix: our compact layout"
        return "original", f"{where} records no {LAYOUT_KEY!r}: taken as an original RookWorld model"
    layout = d[LAYOUT_KEY]
    if layout not in tasks.LAYOUTS:
        raise CheckpointFormatError(f"{where}: {LAYOUT_KEY} is {layout!r}, expected one of {tasks.LAYOUTS}")
    return layout, f"{where} records {LAYOUT_KEY}={layout!r}"


def read_layout(directory: str | os.PathLike) -> tuple[str, str]:
    """(layout, why) of a Hugging Face GPT-2 directory: its recorded layout, or "original" when
    config.json records none (a model that is not ours: RookWorld-LM-124M and its kin)."""
    path = Path(directory) / "config.json"
    d = read_config_json(path)
    config_from_hf(d, path)  # a folder that is no GPT-2 (Llama, GPT-Neo) is named as such, not given a layout
    return _layout_of(d, path)


def layout_for(init_from: str | os.PathLike | None) -> tuple[str, str]:
    """(layout, why) of a run starting from `init_from`: compact from scratch (None or "scratch"),
    else the init model's own (read_layout)."""
    if not init_from or init_from == "scratch":
        return "compact", "a scratch start trains the compact layout"
    return read_layout(init_from)


def candidate_order_for(init_from: str | os.PathLike | None) -> str:
    """The P: candidate order a run starting from `init_from` keeps: the init model's recorded one
    (ORDER_KEY), else the layout's own."""
    if not init_from or init_from == "scratch":
        return "layout"
    path = Path(init_from) / "config.json"
    d = read_config_json(path)
    _layout_of(d, path)  # checks the recorded order
    return d.get(ORDER_KEY, "layout")


def layout_of(model: GPT) -> str:
    """The layout `model` reads and writes: its recorded one; a model loaded without a record is
    original unless it records a prompt prefix; a fresh model is compact."""
    meta, source, prefix = getattr(model, "meta", {}), getattr(model, "source", None), getattr(model, "prompt_prefix", "")
    if source is None and LAYOUT_KEY not in meta:
        return "compact"
    return _layout_of({**meta, **({PROMPT_PREFIX_KEY: prefix} if prefix else {})},
                      f"{source}/config.json" if source else "the model")[0]


def candidates_in_order(moves, evals, order: str) -> tuple[tuple, tuple]:
    """A P: record's (moves, evals) in the candidate order a model was trained on (CANDIDATE_ORDERS;
    a model's is its ORDER_KEY): "uci" sorts them by move text, "layout" keeps the record's."""
    if order not in CANDIDATE_ORDERS:
        raise ValueError(f"candidate order must be one of {CANDIDATE_ORDERS}, got {order!r}")
    pairs = sorted(zip(moves, evals)) if order == "uci" else list(zip(moves, evals))
    return tuple(m for m, _ in pairs), tuple(e for _, e in pairs)


def set_layout(model: GPT, layout: str) -> GPT:
    """Record `layout` in the model (its export's config.json carries it)."""
    tasks.check_layout(layout)
    model.meta[LAYOUT_KEY] = layout
    return model


# -- SFT: P:/A: records as text --------------------------------------------------------------------

class RecordReader(TextReader):
    """SFT's reader of chess data: files of `rookworld datagen` records (task, prompt, completion, ...),
    validated by data.load_jsonl / iter_records and rendered in `layout` with the P: candidates in
    `candidate_order` (CANDIDATE_ORDERS), or {"text": ...} lines; decided per file by its first line.
    The export records the layout and a candidate order other than the layout's. layout None: the start
    model's (layout_for: compact from scratch, "original" for RookWorld-LM), once SFT prepares the reader;
    read before that, compact. SFT's preparation also refuses val/test records in the training files, as
    `rookworld sft` does (check_train_split)."""

    meta_keys = (LAYOUT_KEY, ORDER_KEY)

    def __init__(self, layout: str | None = None, candidate_order: str = "layout"):
        if layout is not None:
            tasks.check_layout(layout)
        if candidate_order not in CANDIDATE_ORDERS:
            raise ValueError(f"candidate_order must be one of {CANDIDATE_ORDERS}, got {candidate_order!r}")
        self.given_layout, self.order = layout, candidate_order
        self._render_in(layout or "compact")

    def _render_in(self, layout: str) -> None:
        self.layout, self.name, self.meta = layout, f"records-{layout}", {LAYOUT_KEY: layout}
        if self.order != "layout":
            self.name += f"-{self.order}"
            self.meta[ORDER_KEY] = self.order

    def prepare(self, cfg) -> None:
        check_train_split(cfg.train_data, cfg.val_data)
        if self.given_layout is None:  # a RookWorld-LM start reads the original layout: trained in compact it was relabelled
            self._render_in(layout_for(cfg.init_from)[0])

    def iter_texts(self, paths):
        for path in map(Path, paths):
            if not _holds_records(path):
                yield from super().iter_texts([path])
                continue
            for _, _, rec in data.iter_records([path]):
                yield self._text(rec, path)

    def load_texts(self, paths) -> list[str]:
        texts: list[str] = []
        for path in map(Path, paths):
            if _holds_records(path):  # load_jsonl also checks for duplicate ids
                texts += [self._text(rec, path) for rec in data.load_jsonl(path)]
            else:
                texts += super().iter_texts([path])
        return texts

    def _text(self, rec: dict, path: Path) -> str:
        if rec["task"] not in tasks.TASKS:
            raise DataFormatError(f"{path}: holds {rec['task']!r} records (an evaluation set), not P:/A: training samples")
        if self.order == "uci" and rec["task"] == "P":
            moves, evals = candidates_in_order(rec["moves"], rec["evals"], self.order)
            return "".join(tasks.policy_text(rec["fen"], moves, evals, rec["best"], self.layout, shuffle=False))
        return "".join(data.record_text(rec, self.layout))


def _holds_records(path: Path) -> bool:
    """True for a file of datagen records, False for {"text": ...} lines (decided by its first line)."""
    first = next(json_lines(path), (0, None))[1]
    if first is None:
        raise DataFormatError(f"{path}: no samples (the file is empty)")
    return isinstance(first, dict) and "task" in first and "text" not in first


# -- GRPO: prompts and the reward ------------------------------------------------------------------

def prompt_items(records, layout: str = "compact") -> list[PromptItem]:
    """PromptItems from data-set records (rookworld_lib.chess.data), each carrying its record as truth."""
    return [PromptItem(r["task"], data.record_text(r, layout)[0], r) for r in records if r["task"] in tasks.TASKS]


def data_vocab(records, layout: str = "compact") -> TaskVocab:
    """The GPT-2 tokens of the records' texts in `layout` (EOT included): GRPO's opt-in vocabulary
    for a model that marks none (`rookworld grpo --vocab task` on RookWorld-LM-124M and its kin)."""
    tok = get_tokenizer()
    return TaskVocab({t for r in records for part in data.record_text(r, layout) for t in tok.encode(part)} | {EOT_ID})


def vocab_distance(model: GPT, vocab: TaskVocab, records, layout: str, n: int = 64, temperature: float = 1.0) -> dict:
    """How far GRPO over `vocab` is from GRPO over all of GPT-2 for `model`, measured on `n` records'
    prompts and completions: the KL per token from the restricted policy to the full one
    (task_vocab.outside_logmass), mean and max, and the share of the probability outside the vocabulary."""
    tok = get_tokenizer()
    seqs = [encode_prompt(p, model.prompt_prefix, tok) + tok.encode(c) for p, c in
            (data.record_text(r, layout) for r in records[:: max(1, len(records) // n)][:n])]
    kl = outside_logmass(model, vocab, seqs, temperature)
    return {"records": len(seqs), "positions": len(kl), "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "mass_outside_max": -math.expm1(-kl.max().item())}


def chess_reward(prompts, completions, truth=None, **_) -> list[float]:
    """GRPO's reward function (TRL's signature): rewards.score of each completion, policy or
    environment by the prompt's prefix, with the record's ground truth where the prompt has one."""
    truth = truth if truth is not None else [None] * len(prompts)
    return [float(rewards.score(p, c, truth=t)) for p, c, t in zip(prompts, completions, truth)]


REWARD_VARIANTS = ("gated", "graded")


def reward_functions(variant: str = "graded") -> tuple[list, list[float]]:
    """GRPO's reward functions and their weights. "gated": chess_reward alone (rewards.score: the
    format-gated policy reward, malformed answers below every valid one); "graded": one function per
    component of the graded policy reward (rewards.policy_component_rewards: B: legal, its quality,
    M: legal, distinct candidates, evals, format, each counting in every answer) and the environment
    reward with a valid next FEN weighted on its own (rewards.GRADED_ENV_WEIGHTS), each logged by the trainer as rewards/<name>/mean, and normalisable one by one (GDPO)."""
    if variant == "gated":
        return [chess_reward], [1.0]
    if variant == "graded":
        return rewards.policy_component_rewards(env_weights=rewards.GRADED_ENV_WEIGHTS), rewards.component_reward_weights()
    raise ValueError(f"reward variant must be one of {REWARD_VARIANTS}, got {variant!r}")


def unlisted_b_note() -> str:
    """How the rewards score a legal B: outside the data's candidates here: searched by Stockfish, or (none
    installed) an estimated eval, so that a run's rewards, and the model it trains, depend on it (rewards' engine="auto")."""
    with contextlib.suppress(engine.StockfishNotFoundError):
        return f"a legal B: outside the data's candidates is searched by Stockfish ({engine.find_stockfish()})"
    return (f"a legal B: outside the data's candidates gets an estimated eval (no Stockfish found: the last "
            f"candidate's minus {rewards.DEFAULT_GRADED_WEIGHTS.unlisted_margin_cp} cp), so the rewards differ from a run "
            "with Stockfish; install it (make setup) or set STOCKFISH_PATH")


def policy_weights(variant: str = "graded"):
    """The weights under which rewards.score_policy_detailed gives, for a P: answer, the total that
    reward_functions(variant) sums (and each component it sums)."""
    if variant not in REWARD_VARIANTS:
        raise ValueError(f"reward variant must be one of {REWARD_VARIANTS}, got {variant!r}")
    return rewards.GradedWeights() if variant == "graded" else rewards.PolicyWeights()


def training_tasks(data_dir=None) -> list[str]:
    """The tasks with training files in a data directory; ValueError naming the directory (and why it
    holds none: missing, a file) and the file names looked for where there are none."""
    present = [task for task in tasks.TASKS if data.split_files(task, "train", data_dir)]
    if not present:
        base = Path(data_dir or data.DATA_DIR)
        raise ValueError(f"{base}{data.not_a_folder(base)}: no training data: no "
                         + " and no ".join(data.looked_for(task, "train") for task in tasks.TASKS)
                         + " (rookworld datagen or rookworld convert --split train writes them)")
    return present


def train_records(data_dir=None) -> list[dict]:
    """The P: and A: training records of a data directory (plain, .gz or sharded files); either task
    may be absent (a converted original set may hold one task only), not both. A warning says how many
    of them stand at a position of the directory's val or test records (converted sets are not split
    by position, as datagen's are): those are measured on positions the model trained on."""
    present = training_tasks(data_dir)
    records = [r for task in present for r in data.load_split(task, "train", data_dir).records]
    with contextlib.suppress(ValueError):  # no val or test files there: nothing to overlap
        held = heldout_positions(data_dir or data.DATA_DIR)
        shared = sum(tasks.position_key(r["fen"]) in held for r in records)
        if shared and distributed.main_process():  # said once under torchrun
            log.warning("%s: %d of the %d training records stand at a position of its val or test records: an "
                        "evaluation there measures positions the model trained on", data_dir or data.DATA_DIR,
                        shared, len(records))
    return records


# -- rookworld sft ---------------------------------------------------------------------------------

def build_sft_parser() -> argparse.ArgumentParser:
    """`rookworld sft`'s options: --nproc, --layout and one per SFTConfig field."""
    ap = distributed.command_parser(
        "sft", "Supervised pretraining on P:/A: task text: packed samples, AdamW, warm-up + cosine, periodic val "
               "loss and atomic checkpoints; resumes from <out>/checkpoints.",
        "rookworld sft --train-data data/policy_train.jsonl data/env_train.jsonl --val-data data/policy_val.jsonl "
        "data/env_val.jsonl --model cpu-small --max-steps 300 --out runs/sft-cpu",
        nproc_note="; --batch-size must be a multiple of N")
    ap.add_argument("--layout", default=None, choices=list(tasks.LAYOUTS),
                    help="how records are rendered (default: --init-from's own; compact from scratch); {\"text\": ...} lines "
                         "are trained as written, and the export records this layout for them")
    ap.add_argument("--candidate-order", default=None, choices=list(CANDIDATE_ORDERS),
                    help="how P: records list their (move, eval) pairs: the layout's own order (compact: best "
                         "first; original: shuffled) or uci (sorted by move text; docs/grpo.md, section 4); "
                         "default: --init-from's recorded order, else the layout's")
    docs = {"train_data": "JSONL training files: P:/A: records or {\"text\": ...} lines (default: the "
                          "shipped data/policy_train.jsonl and data/env_train.jsonl)",
            "val_data": "JSONL files for the val loss (default: the shipped *_val.jsonl files when --train-data is "
                        "not given, else val_fraction of the training samples)",
            "model": f"GPTConfig preset of a scratch start (default: {SFTConfig.model!r}); --init-from trains "
                     "the model in DIR, whatever its shape"}
    _add_policy_fraction(ap, "samples in the packed stream")
    add_config_arguments(ap, SFTConfig, help_overrides=docs, skip=("task_weights",),
                         metavars={"train_data": "FILE", "val_data": "FILE", "init_from": "DIR", "out_dir": "DIR"})
    ap.set_defaults(model=None)  # given or not: with --init-from it is refused (see _sft_config_from_args)
    return ap


@contextlib.contextmanager
def _mix_advice_in_flags():
    """The core's task_weights advice, said in the command's own option (--policy-fraction)."""
    try:
        yield
    except ValueError as exc:
        if "task_weights gives" in str(exc):
            raise ValueError(f"{exc} (on the command line: --policy-fraction 1 trains on P: alone, 0 on A: alone)") from None
        if "with task_weights set" in str(exc):
            raise ValueError(f"{exc} (on the command line: --policy-fraction none takes every sample as it is)") from None
        raise


def _add_policy_fraction(ap: argparse.ArgumentParser, what: str) -> None:
    def share(text: str) -> float | None:
        return None if text.lower() in ("none", "null") else float(text)
    ap.add_argument("--policy-fraction", type=share, default=POLICY_FRACTION, metavar="F",
                    help=f"share of P: {what}, the rest A: (the core's task_weights {{'P': F, 'A': 1 - F}}); none: "
                         f"one pool, the data's own mix (default: {POLICY_FRACTION})")


def check_train_split(paths, val_paths=()) -> None:
    """Refuse training files holding datagen records of the val or test split (any record, not only the
    first): eval scores the test positions as held out and SFT's val loss the val ones, so training on
    them would inflate both without a word. Likewise train records in the val files, a file given twice
    (its samples counted twice, and held out by val_fraction while their twins train) or as both."""
    given = [Path(p).resolve() for p in (*paths, *val_paths)]
    if twice := next((p for i, p in enumerate(given) if p in given[:i]), None):
        raise ValueError(f"{twice} is given twice (--train-data, --val-data): its samples would count twice, or "
                         "the val loss would measure samples SFT trains on; give each file once")
    for files, refused, what in ((paths, ("val", "test"), "training data: SFT trains on the train split (eval scores "
                                  "the test positions, the val loss the val ones); give the *_train files (`rookworld "
                                  "convert --split train` for converted data)"),
                                 (val_paths, ("train",), "val data: the val loss would measure samples SFT trains on; "
                                  "give the *_val files")):
        for path in map(Path, files):
            for lineno, rec in json_lines(path):
                if isinstance(rec, dict) and rec.get("split") in refused:
                    raise DataFormatError(f"{path}:{lineno}: a {rec['split']!r} record in the {what}")


def _sft_config_from_args(args: argparse.Namespace) -> tuple[SFTConfig, RecordReader]:
    kwargs = {**config_kwargs_from_args(SFTConfig, args, skip=("task_weights",)),
              "task_weights": task_weights(args.policy_fraction)}
    if kwargs["model"] is None:
        del kwargs["model"]
    elif kwargs["init_from"] != "scratch":
        raise ValueError(f"--model {kwargs['model']} picks the model of a scratch start; --init-from trains the "
                         f"one in {kwargs['init_from']}: give one of them")
    if not kwargs["train_data"]:  # default: the shipped data set, when it has been generated
        kwargs["train_data"] = data.split_paths("train")
        if not kwargs["val_data"]:
            kwargs["val_data"] = data.split_paths("val")
        if not kwargs["train_data"]:
            raise ValueError("give training data: --train-data FILE [FILE ...] (JSONL; `rookworld datagen` "
                             "writes data/policy_train.jsonl and data/env_train.jsonl)")
        log.info("data: %s (val: %s)", ", ".join(kwargs["train_data"]), ", ".join(kwargs["val_data"]) or "held out")
    cfg = SFTConfig(**kwargs)  # the files' splits: checked by the reader, as SFT prepares it (RecordReader.prepare)
    layout, why = (args.layout, "--layout") if args.layout else layout_for(cfg.init_from)
    log.info("layout: %s (%s)", layout, why)
    order = candidate_order_for(cfg.init_from)
    if args.candidate_order not in (None, order) and (cfg.task_weights or {}).get("P", 1.0) == 0:
        raise ValueError(f"--candidate-order {args.candidate_order} has no effect at --policy-fraction 0 (no P: sample is "
                         "trained on or measured): leave it out, or give P: samples a share")
    order = args.candidate_order or order
    return cfg, RecordReader(layout, order)


def _sft_preflight(argv: list[str], nproc: int) -> None:
    """Refuse, before torchrun starts, settings that every worker would refuse."""
    cfg, _ = _sft_config_from_args(build_sft_parser().parse_args(argv))
    check_train_split(cfg.train_data, cfg.val_data)  # once here, not in every worker first
    if cfg.batch_size % nproc:
        raise ValueError(f"--batch-size ({cfg.batch_size}) must be a multiple of --nproc ({nproc}): each process "
                         "trains on batch_size / nproc rows of every micro-batch")


def sft_cli(argv: list[str] | None = None) -> int:
    """`rookworld sft`; errors are reported in one line by the lab's cli.main."""
    return distributed.run_command("sft", argv, build_sft_parser, _run_sft, preflight=_sft_preflight)


def _run_sft(args: argparse.Namespace) -> int:
    cfg, reader = _sft_config_from_args(args)
    with _mix_advice_in_flags():
        result = train_sft(cfg, reader=reader)
    if not distributed.main_process():  # under torchrun only rank 0 reports
        return 0
    # the run's records, those of the steps before a resume too (a finished run run again trains none)
    kept = result.out_dir / METRICS_FILE if result.out_dir else None
    history = read_metrics(kept) if kept and kept.is_file() else result.history
    last = next((r for r in reversed(history) if r.get("loss") is not None), {})
    val = [r["eval/loss"] for r in history if r.get("eval/loss") is not None]
    print(f"SFT finished at step {result.step}: loss {last.get('loss')}, val loss {val[-1] if val else None}; "
          f"checkpoint {result.checkpoint}; metrics {result.out_dir / METRICS_FILE}"
          + (f"; Hugging Face model in {result.final_dir}" if result.final_dir else ""))
    return 0


# -- rookworld grpo --------------------------------------------------------------------------------

def build_grpo_parser() -> argparse.ArgumentParser:
    """`rookworld grpo`'s options: the model, data and layout, --nproc, and one per config field."""
    ap = distributed.command_parser(
        "grpo", "GRPO on chess with verifiable rewards: grouped rollouts from the KV-cached sampler, "
                "python-chess/Stockfish rewards, the clipped GRPO loss; resumes from <out>/checkpoints.",
        "rookworld grpo --init-from runs/sft-cpu/final --out runs/grpo-cpu --steps 50")
    ap.add_argument("--init-from", required=True, metavar="DIR", type=path_arg,
                    help="Hugging Face GPT-2 directory: our SFT export or a RookWorld-LM-124M copy")
    ap.add_argument("--data-dir", default=None, metavar="DIR", type=path_arg, help="rookworld datagen output (default data/)")
    ap.add_argument("--layout", default=None, choices=list(tasks.LAYOUTS),
                    help="prompt layout (default: the model's, from its config.json; a GPT-2 directory "
                         "without our record, such as RookWorld-LM-124M, is original)")
    ap.add_argument("--reward", default="graded", choices=REWARD_VARIANTS,
                    help="graded (the default, as in every profile): one reward function per policy component, each counting in "
                         "every answer and logged as rewards/P/<component>/mean; gated: one format-gated reward "
                         "(rewards.score): alike on a model that reads the board, worse on the cpu profile's (docs/grpo.md)")
    _add_policy_fraction(ap, "prompts of each step")
    add_config_arguments(ap, GRPOTrainConfig, skip=("loss", "task_weights"), metavars={"out_dir": "DIR"},
                         help_overrides={"out_dir": "grpo_metrics.jsonl, completions.jsonl, checkpoints/ and final/ "
                                                    "go here (required)",
                                         "max_new_tokens": "completion budget (default: the layout's, "
                                         + " / ".join(f"{v} {k}" for k, v in tasks.COMPLETION_BUDGET.items()) + ")"})
    ap.set_defaults(max_new_tokens=None)
    add_config_arguments(ap, grpo.GRPOConfig, skip=("temperature", "max_completion_length"))
    return ap


def _grpo_config_from_args(args: argparse.Namespace, say=lambda line: None) -> tuple[GRPOTrainConfig, str]:
    """The run's config and layout (the model's own unless --layout), with the layout's budget, told to
    `say`. The settings are checked before the model directory is read, so that a bad one is named first."""
    if not args.out_dir:
        raise ValueError("give an output directory: --out DIR")
    given = args.max_new_tokens
    # the run's config first: its checks (max_new_tokens >= 1, as eval's) name the field the user set
    cfg = GRPOTrainConfig(**{**config_kwargs_from_args(GRPOTrainConfig, args, skip=("loss", "task_weights")),
                             "max_new_tokens": 1 if given is None else given,
                             "task_weights": task_weights(args.policy_fraction)})
    loss = grpo.GRPOConfig(**config_kwargs_from_args(grpo.GRPOConfig, args, skip=("temperature", "max_completion_length")),
                           max_completion_length=cfg.max_new_tokens, temperature=args.temperature)
    layout, why = (args.layout, "--layout") if args.layout else read_layout(args.init_from)
    budget = tasks.COMPLETION_BUDGET[layout] if given is None else given
    say(f"layout: {layout} ({why}); max_new_tokens {budget}")
    return replace(cfg, max_new_tokens=budget, loss=replace(loss, max_completion_length=budget)), layout


def _grpo_preflight(argv: list[str], nproc: int) -> None:
    """Refuse, before torchrun starts, settings that every worker would refuse; say once when some
    processes would sample nothing (a rank takes whole rollout chunks)."""
    cfg = _grpo_config_from_args(build_grpo_parser().parse_args(argv))[0]
    check_world_size(cfg, nproc)
    if cfg.rollout_chunks < nproc:
        print(f"rookworld grpo: note: --rollout-chunks {cfg.rollout_chunks} < --nproc {nproc}: "
              f"{nproc - cfg.rollout_chunks} of the processes sample nothing in a step (a process samples whole "
              f"chunks); --rollout-chunks {nproc} spreads the sampling over all of them", file=sys.stderr, flush=True)


def grpo_cli(argv: list[str] | None = None) -> int:
    """`rookworld grpo`; errors are reported in one line by the lab's cli.main."""
    return distributed.run_command("grpo", argv, build_grpo_parser, _run_grpo, preflight=_grpo_preflight)


def _say(line: str) -> None:
    """A line about the run on stderr, once: under torchrun rank 0 says it."""
    if distributed.main_process():
        print(line, file=sys.stderr)


def _run_grpo(args: argparse.Namespace) -> int:
    cfg, layout = _grpo_config_from_args(args, say=_say)
    records = train_records(args.data_dir)
    # On a GPU the padded vocabulary (50304 rows) runs the LM head on fast matmul kernels; the
    # logits and every result are unchanged (docs/perf.md).
    pad = 64 if setup_runtime(cfg.device, cfg.dtype).device.type == "cuda" else 1
    model = set_layout(GPT.from_pretrained(args.init_from, pad_vocab_to_multiple=pad), layout)  # the export records it
    vocab = None
    if cfg.vocab == "task" and TaskVocab.of_model(model) is None:  # the opt-in: the data's tokens, distance measured
        vocab = data_vocab(records, layout)
        d = vocab_distance(model, vocab, records, layout, temperature=cfg.temperature)
        _say(f"task vocabulary: {len(vocab)} tokens of the training records; on {d['records']} records' text the "
             f"restricted policy is {d['kl_mean']:.2e} nats/token from the full one (max {d['kl_max']:.2e}; at most "
             f"{d['mass_outside_max']:.2e} of the probability outside)")
    funcs, weights = reward_functions(args.reward)
    with _mix_advice_in_flags():
        trainer = GRPOTrainer(model, prompt_items(records, layout), cfg, reward_funcs=funcs, reward_weights=weights,
                              init_from=args.init_from, task_vocab=vocab)
    _say(f"sampling over {trainer.sampling_vocabulary()}; prompt prefix {model.prompt_prefix!r}; {unlisted_b_note()}")
    try:
        trainer.train()  # writes <out>/final at the end (--no-export-hf: not)
        if trainer.dist.is_main:
            print(f"GRPO finished at step {trainer.step}; metrics {trainer.out_dir / GRPO_METRICS_FILE}"
                  + (f"; model in {trainer.out_dir / FINAL_DIR}" if cfg.export_hf else ""))
    finally:
        trainer.close()  # before the process group goes (see Trainer.close)
    return 0

"""Interactive explorers (JupyterLab widgets) with static snapshots for headless runs.

- PositionExplorer: a held-out P: position (slider over a split, or a pasted FEN): the board with
  Stockfish's candidates and the model's greedy best move as arrows, the model's probability of each
  candidate, its greedy completion and the reward breakdown;
- GroupInspector: one prompt, G sampled completions, their rewards and group advantages (GRPO's view);
- RolloutBrowser: a GRPO step's batch as the loss saw it (reward, advantage, ratio, clipping);
- ClipControls: the clip-region and length-bias figures of notebook 03 under epsilon / loss type /
  group size controls.

Every explorer holds its state in plain attributes (tests drive it without a browser) and a widget
tree in `.widget`. Displayed in a notebook (last expression of a cell), it sends the widget *and*
a static HTML snapshot: JupyterLab shows the widget, a headless run (papermill, nbval, nbconvert)
keeps the snapshot. Outside a Jupyter kernel only the snapshot is sent. CSS classes (`rw-...`) on
the widgets and on the snapshot are the contract of the browser tests.
"""

from __future__ import annotations

import contextlib
import html
import math
from pathlib import Path

import chess
import chess.svg
import ipywidgets as W
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..core import grpo
from ..chess import rewards, tasks
from ..chess.engine import get_pool, stockfish_available
from ..chess.evaluate import EvalConfig, complete, policy_prompt_of
from ..core.config import is_int
from ..core.model import GPT, GPTConfig
from ..core.paths import RUNS_DIR, read_jsonl
from ..core.progress import widget_frontend
from .plots import series_colour
from ..core.sampling import SamplingConfig, generate, sequence_logprobs
from ..core.tokenizer import EOT_ID, encode, encode_prompt, get_tokenizer
from ..chess.training import (ORDER_KEY, REWARD_VARIANTS, candidates_in_order, policy_weights, prompt_items,
                              reward_functions)
from ..core.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from ..core.train_grpo import COMPLETION_KEYS, METRICS_FILE, reward_name, reward_sum, reward_table

CANDIDATE_COLOR, MODEL_COLOR = "#15781B80", "#1f4fd8cc"  # Stockfish green, model blue (chess.svg: #RRGGBBAA)
# the rows GRPOTrainer writes to completions.jsonl; ratio and clip_fraction are optional here (before an update)
ROLLOUT_KEYS = tuple(k for k in COMPLETION_KEYS if k not in ("ratio", "clip_fraction"))
WIDGETS: bool | None = None  # None: widgets where a frontend can show them (see _live); True / False: force


def _live() -> bool:
    """Widgets where a frontend renders them (not papermill or nbval: the static snapshot only)."""
    return widget_frontend() if WIDGETS is None else WIDGETS


def newest_export(root: str | Path) -> Path | None:
    """The newest exported model (a `final/` folder with its config.json) anywhere under `root`."""
    found = sorted(Path(root).glob("**/final/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def latest_run(root: str | Path = RUNS_DIR) -> Path | None:
    """The run folder (`root/<stamp>`, as `rookworld run` and notebook 05 make them) of the newest
    exported model under `root`; None when there is none."""
    export = newest_export(root)
    return Path(root) / export.relative_to(root).parts[0] if export is not None else None


def rollout_settings(run_dir: str | Path | None) -> dict | None:
    """How the newest GRPO run under `run_dir` sampled, scored and weighed its rollouts (its latest
    checkpoint's settings), as keyword arguments of sample_groups and GroupInspector: temperature,
    max_new_tokens, top_k, top_p, reward (the training.REWARD_VARIANTS whose functions it recorded;
    None: functions of the user's own), scale and aggregation (its scale_rewards and
    multi_objective_aggregation); None when `run_dir` holds no readable GRPO checkpoint."""
    for metrics in sorted(Path(run_dir).glob(f"**/{METRICS_FILE}"), key=lambda p: p.stat().st_mtime)[::-1] if run_dir else ():
        with contextlib.suppress(CheckpointError, KeyError, TypeError):  # unreadable or not GRPO's: the default
            if (path := latest_checkpoint(metrics.parent / "checkpoints")) is not None:
                ckpt = load_checkpoint(path)
                config, names = ckpt["config"], [n for n, _ in ckpt["extra"].get("rewards", [])]
                reward = next((v for v in REWARD_VARIANTS if names == list(map(reward_name, reward_functions(v)[0]))),
                              None)
                return {"temperature": float(config["temperature"]), "max_new_tokens": int(config["max_new_tokens"]),
                        "top_k": int(config.get("top_k", 0)), "top_p": float(config.get("top_p", 1.0)), "reward": reward,
                        "scale": config.get("scale_rewards", "group"),
                        "aggregation": config.get("multi_objective_aggregation", "sum_then_normalize")}
    return None


def load_model(model_dir: str | None = None, run_dir: str | None = None, seed: int = 0,
               device: str = "cpu") -> tuple[GPT, str]:
    """(model in eval mode on `device`, where it came from): `model_dir`; "latest": the newest export
    under runs/; None: the newest export under `run_dir` (one it must hold), or without a run_dir a
    seeded random-init tiny GPT."""
    if model_dir == "latest":
        if (export := newest_export(RUNS_DIR)) is None:
            raise FileNotFoundError(f"model_dir='latest': no exported model (final/config.json) under {RUNS_DIR}")
        model_dir = str(export)
    elif model_dir is None and run_dir is not None:  # a run named: its model, never a random one in its place
        if not Path(run_dir).is_dir():
            raise FileNotFoundError(f"run_dir {str(run_dir)!r} is no folder: give a run folder (runs/<stamp>) or None "
                                    "(the newest run)")
        if (export := newest_export(run_dir)) is None:
            raise FileNotFoundError(f"run_dir {str(run_dir)!r} holds no exported model (no final/config.json under "
                                    "it: a run that was interrupted or failed before its export); give another run "
                                    "folder, or None (the newest run with a model)")
        model_dir = str(export)
    if model_dir is not None:
        return GPT.from_pretrained(model_dir).to(device).eval(), model_dir
    torch.manual_seed(seed)
    return GPT(GPTConfig.preset("tiny")).to(device).eval(), "a random-init tiny GPT (GPTConfig.preset('tiny'))"


def read_rollouts(source) -> list[dict]:
    """Rollout rows from a list of dicts or a completions.jsonl path; a row without a required key
    raises naming it (ratio and clip_fraction may be missing or null: before an update)."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():  # a run folder: IsADirectoryError said no more
        found = sorted(Path(source).glob("**/completions.jsonl"))
        raise ValueError(f"{source} is a directory; give a completions.jsonl file"
                         + (f", e.g. {found[0]}" if found else " (a GRPO run writes <run>/training/grpo/completions.jsonl)"))
    rows = list(source) if not isinstance(source, (str, Path)) else [
        obj if err is None else f"line {n}: {err}" for n, obj, err in read_jsonl(source, torn_tail=True)]
    where = source if isinstance(source, (str, Path)) else "rollouts"
    for i, r in enumerate(rows):  # torn_tail: a live run may be mid-append
        if not isinstance(r, dict) or (missing := [k for k in ROLLOUT_KEYS if k not in r]):
            raise ValueError(f"{where}: row {i + 1}: "
                             + (f"missing {missing} (needs {list(ROLLOUT_KEYS)})" if isinstance(r, dict) else str(r)))
        bad = next((k for k, ok in (("step", is_int(r["step"])), ("group", is_int(r["group"])),
                                    ("advantage", _is_number(r["advantage"])),
                                    ("reward", r["reward"] is None or _is_number(r["reward"]))) if not ok), None)
        if bad:
            raise ValueError(f"{where}: row {i + 1}: {bad} is {r[bad]!r}, expected "
                             + ("an integer" if bad in ("step", "group") else "a number" + " or null" * (bad == "reward")))
    # a NaN reward is an unscored completion, as the trainer writes it (null): out of the means
    return [dict(r, reward=None) if r["reward"] is not None and math.isnan(r["reward"]) else r for r in rows]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# --- HTML pieces (escaped; shared by widgets and static snapshots)

def _fmt(x, spec: str = "+.3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return format(x, spec) if isinstance(x, float) else str(x)


def _table(headers, rows, cls: str, row_cls: str = "", raw: tuple = ()) -> str:
    """An HTML table; cells are escaped except the columns named in `raw` (already HTML)."""
    # a header breaks between words only ("mov|e" under the info column's overflow-wrap:anywhere)
    head = "".join(f"<th style='overflow-wrap:normal'>{html.escape(h)}</th>" for h in headers)
    body = "".join(f'<tr class="{row_cls}">' + "".join(
        f"<td>{c if h in raw else html.escape(str(c))}</td>" for h, c in zip(headers, r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _share(x: float) -> str:
    """A share in (0, 1] as a percentage that neither rounds a small one to 0% nor a large one to 100%."""
    return f"{x:.0%}" if 0.01 <= x <= 0.99 or x == 1 else "<1%" if x < 0.01 else ">99%"


def _push(advantage: float) -> str:
    return "up" if advantage > 0 else "down" if advantage < 0 else "none (A = 0)"


def _pre(text: str) -> str:  # long runs without a space (a model's noise) wrap too, never past the right edge
    return f"<code style='white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.25'>{html.escape(text)}</code>"


class _Explorer:
    """A widget tree (`widget`) plus a static snapshot (`html()`), displayed together in a kernel."""

    widget: W.Widget
    css: tuple[str, str]  # the snapshot's classes (explorer, table) where html() is the explorer's _table()

    def html(self) -> str:
        return f"<div class='{self.css[0]}'><div class='{self.css[1]}'>{self._table()}</div></div>"

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": f"<{type(self).__name__}: a widget; static snapshot in text/html>",
                  "text/html": self.html()}
        if _live():  # JupyterLab renders the widget view, other readers of the notebook the text/html
            bundle.update({k: v for k, v in self.widget._repr_mimebundle_().items() if k != "text/plain"})
        return bundle


# --- Position explorer

@torch.no_grad()
def candidate_probabilities(model: GPT, record: dict) -> list[dict]:
    """For each Stockfish candidate of a P: record: the model's log-prob of the completion naming it
    as B: (the record's M:/E: fields, the move, then EOT) and p(B: = move | prompt, M:, E:), the
    probability of the tokens after "B:" (disjoint events: they add up to at most 1). The M:/E: fields
    list the candidates in the order the model was trained on (its ORDER_KEY: sorted for "uci")."""
    cfg, tok = EvalConfig().for_model(model), get_tokenizer()
    order = model.meta.get(ORDER_KEY, "layout")
    moves, evals = candidates_in_order(record["moves"], record["evals"], order)
    texts = [tasks.policy_completion(moves, evals, m, cfg.layout, shuffle=order == "layout") for m in record["moves"]]
    ids = [encode(t, tok) + [EOT_ID] for t in texts]
    head = encode(texts[0][:texts[0].rindex("B:") + 2], tok)  # " M: ... E: ... B:", the same in every text
    assert all(x[:len(head)] == head for x in ids), "the B: move must start a new token"
    L, device = max(map(len, ids)), next(model.parameters()).device
    tokens = torch.tensor([x + [EOT_ID] * (L - len(x)) for x in ids], device=device)
    prompt = encode_prompt(policy_prompt_of(record, cfg.layout), cfg.prompt_prefix, tok)
    lp = sequence_logprobs(model.eval(), [prompt] * len(ids), tokens).double().cpu()
    return [{"move": m, "eval": str(e), "logp_completion": float(lp[i, :len(ids[i])].sum()),
             "p_best": math.exp(float(lp[i, len(head):len(ids[i])].sum()))}
            for i, (m, e) in enumerate(zip(record["moves"], record["evals"]))]


def record_for_fen(fen: str) -> dict:
    """A P: record for a pasted FEN, spelt as the data spell it (tasks.canonical_fen: an en-passant
    square given is kept); Stockfish's candidates when it is installed, none otherwise."""
    board = chess.Board(fen)  # ValueError names a malformed FEN
    if not board.is_valid():
        raise ValueError(f"not a legal position: {fen!r} ({tasks.status_words(board.status())})")
    if not any(board.legal_moves):
        raise ValueError(f"no move to make in {fen!r}: {'checkmate' if board.is_checkmate() else 'stalemate'}")
    a = get_pool().analyse(board) if stockfish_available() else None
    return {"fen": tasks.canonical_fen(board), "moves": list(a.moves) if a else [], "evals": list(a.evals) if a else [],
            "best": a.best if a else None, "limit": a.limit if a else None}


def _policy_records(records: list[dict]) -> list[dict]:
    """`records`, checked to be P: records: the explorer draws a position's candidate moves and
    scores a best move, which A: (environment) records do not have (GroupInspector takes both)."""
    if not records:
        raise ValueError("PositionExplorer needs at least one P: record, e.g. data.load_split('P', 'test').records")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            what = f"a {type(rec).__name__}"
        elif rec.get("task", "P") != "P":
            what = f"a record of task {rec['task']!r}"
        elif missing := [k for k in rewards.POLICY_TRUTH_COLUMNS if k not in rec]:
            what = f"a record without {missing}"
        elif not isinstance(rec["fen"], str) or (err := tasks.fen_error(rec["fen"])):
            what = f"a record whose 'fen' is no valid FEN ({err if isinstance(rec['fen'], str) else type(rec['fen']).__name__})"
        else:
            continue
        raise ValueError(f"PositionExplorer shows P: (policy) records; records[{i}] is {what}: give P: records, "
                         "e.g. data.load_split('P', 'test').records")
    return records


class PositionExplorer(_Explorer):
    """One P: position at a time: `select(index)` over `records`, or `set_fen(fen)`."""

    def __init__(self, model: GPT, records: list[dict], index: int = 0, *, max_new_tokens: int | None = None,
                 size: int = 360, reward: str = "graded"):
        self.model, self.records, self.size = model.eval(), _policy_records(records), size
        self.reward = reward  # the trainer's reward variant (training.reward_functions): the score shown
        self.decoding = EvalConfig(batch_size=1, max_new_tokens=max_new_tokens)  # greedy, the model's layout
        self.slider = W.IntSlider(value=index, min=0, max=len(records) - 1, description="position",
                                  continuous_update=False)
        self.fen_box = W.Text(placeholder="paste a FEN and press Enter", description="FEN",
                              continuous_update=False, layout=W.Layout(width="60%"))
        # after a paste the slider still reads its position, and a slider moved onto its own value says nothing
        self.back = W.Button(layout=W.Layout(display="none"))
        self.back.on_click(lambda _: self.select(self.slider.value))
        self.board_html, self.info_html, self.error_html = W.HTML(), W.HTML(), W.HTML()
        self.info_html.layout = W.Layout(min_width="0", flex="1 1 auto")  # shrinks with the page, never past it
        self.widget = W.VBox([W.HBox([self.slider, self.fen_box, self.back]), self.error_html,
                              W.HBox([self.board_html, self.info_html])])
        for w, cls in ((self.widget, "rw-position-explorer"), (self.slider, "rw-position-slider"),
                       (self.board_html, "rw-board"), (self.info_html, "rw-position-info")):
            w.add_class(cls)
        self.index = None
        self.select(index)
        self.slider.observe(lambda ch: self.select(ch["new"]), names="value")
        self.fen_box.observe(lambda ch: self._fen_typed(ch["new"]), names="value")

    def select(self, index: int) -> PositionExplorer:
        """Show records[index] (the slider follows)."""
        if not 0 <= index < len(self.records):
            raise IndexError(f"position index {index} is outside 0..{len(self.records) - 1}")
        if index != self.index:
            self.index = index
            self._show(self.records[index])
            self.slider.value = index
            self.fen_box.value = ""  # the box shows no FEN the board no longer shows (and takes the same one again)
            self.back.layout.display = "none"
        return self

    def set_fen(self, fen: str) -> PositionExplorer:
        """Show a pasted position (candidates from Stockfish, when installed)."""
        record = record_for_fen(fen.strip())
        self.index = None
        self._show(record)
        self.back.description, self.back.layout.display = f"back to position {self.slider.value}", None
        return self

    def _fen_typed(self, fen: str) -> None:
        try:
            if fen.strip():  # a cleared box: nothing to show
                self.set_fen(fen)
        except ValueError as exc:  # a user's typo: say so in place (the last error only), keep the last board
            where = f"test position {self.index}" if self.index is not None else "the last pasted FEN"
            self.error_html.value = (f"<div style='color:#b00020;overflow-wrap:anywhere'><b>{html.escape(str(exc))}</b>"
                                     f" (still showing {where})</div>")

    def _show(self, record: dict) -> None:
        self.error_html.value = ""
        self.record, self.fen = record, record["fen"]
        board = chess.Board(self.fen)
        self.prompt = policy_prompt_of(record, EvalConfig().for_model(self.model).layout)
        self.greedy = complete(self.model, [self.prompt], self.decoding)[0]
        best = tasks.parse_policy_completion(self.greedy).best
        self.greedy_move = best if best and tasks.legal_move(board, best) else None
        self.candidates = candidate_probabilities(self.model, record) if record["moves"] else []
        self.score = (rewards.score_policy_detailed(self.prompt, self.greedy, truth=record,
                                                    weights=policy_weights(self.reward)).as_dict()
                      if record["moves"] else None)
        # the model's arrow first, under the candidates' see-through ones: drawn last it hid a shorter
        # candidate along the same line (its e2e4 over Stockfish's e2e3); its target square is tinted too
        model_move = [chess.Move.from_uci(self.greedy_move)] if self.greedy_move else []
        arrows = [chess.svg.Arrow(m.from_square, m.to_square, color=MODEL_COLOR) for m in model_move] + \
            [chess.svg.Arrow(m.from_square, m.to_square, color=CANDIDATE_COLOR) for m in map(chess.Move.from_uci, record["moves"])]
        self.svg = chess.svg.board(board, arrows=arrows, size=self.size,
                                   fill={m.to_square: MODEL_COLOR[:7] + "40" for m in model_move})
        self.board_html.value, self.info_html.value = self.svg, self._info()

    def _info(self) -> str:
        board, weights = chess.Board(self.fen), policy_weights(self.reward)
        cands = _table(["move", "SAN", "Stockfish eval", "log p(completion) at T = 1", "p(B: = move) at T = 1"],
                       [[c["move"] + (" (model)" if c["move"] == self.greedy_move else ""),
                         board.san(chess.Move.from_uci(c["move"])), c["eval"], _fmt(c["logp_completion"], ".2f"),
                         _fmt(c["p_best"], ".3g")] for c in self.candidates], "rw-candidates")
        score = ("<i>no ground truth (Stockfish not installed): no reward</i>" if self.score is None else
                 _table(["component", "value", "weight in the total"],
                        [[k, "; ".join(v) or "none" if k == "errors" else _fmt(v), _fmt(getattr(weights, k, None), "g")
                          if isinstance(getattr(weights, k, None), float) else ""] for k, v in self.score.items()],
                        "rw-reward"))
        where = f"test position {self.index}" if self.index is not None else "pasted FEN"
        return (f"<div style='overflow-wrap:anywhere;min-width:0'><b>{where}</b>: {html.escape(self.fen)}<br>"
                f"<span style='color:#15781B'>&#9632;</span> Stockfish candidates &nbsp; "
                f"<span style='color:#1f4fd8'>&#9632;</span> model's greedy B: "
                f"{html.escape(self.greedy_move or 'none legal')}<br>{cands}"
                f"<b>greedy completion</b><br>{_pre(self.greedy)}<br><b>reward</b> (the {self.reward} reward GRPO trains "
                f"on: score_policy_detailed, weights training.policy_weights({self.reward!r}))<br>{score}</div>")

    def html(self) -> str:
        return (f"<div class='rw-position-explorer' style='display:flex;gap:1em'>"
                f"<div class='rw-board'>{self.svg}</div>{self._info()}</div>")


# --- Group inspector

def _group_prompts(model: GPT, records: list[dict], max_new_tokens: int | None) -> tuple[list, list, int]:
    """(prompt items, their token ids, the token budget sampled: max_new_tokens or the layout's, within
    the context) of P:/A: records, as sample_groups samples them."""
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or rec.get("task") not in tasks.TASKS:
            got = f"a record of task {rec.get('task')!r}" if isinstance(rec, dict) else f"a {type(rec).__name__}"
            raise ValueError(f"records[{i}] is {got}: the groups sample P: and A: prompts (data.load_split('P', 'test'))")
    cfg, tok = EvalConfig().for_model(model), get_tokenizer()
    items = prompt_items(records, cfg.layout)
    ids = [encode_prompt(i.prompt, cfg.prompt_prefix, tok) for i in items]
    return items, ids, max(1, min(max_new_tokens or cfg.max_new_tokens, model.config.block_size - max(map(len, ids))))


def sample_groups(model: GPT, records: list[dict], group_size: int = 4, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, max_new_tokens: int | None = None, seed: int = 0, scale: str = "group",
                  aggregation: str = "sum_then_normalize", step: int = 0, reward: str = "graded") -> list[dict]:
    """One rollout batch as GRPO's samples it: G completions per record's prompt in one batched
    `generate` call, each scored by the trainer's reward (`reward_functions(reward)`: the functions and
    weights the trainer sums), with its group advantage as the trainer computes it (its scale_rewards
    and multi_objective_aggregation: `scale`, `aggregation`). Rows in the RolloutBrowser format, group =
    the record's index (ratio, clip_fraction None: no update yet)."""
    items, ids, budget = _group_prompts(model, records, max_new_tokens)
    ro = generate(model.eval(), ids, SamplingConfig(max_new_tokens=budget, temperature=temperature, top_k=top_k,
                                                    top_p=top_p, num_samples=group_size, seed=seed))
    texts, rows = ro.completions(get_tokenizer()), [i for i in items for _ in range(group_size)]
    funcs, weights = reward_functions(reward)
    table = reward_table(funcs, rows, texts)
    scores = reward_sum(table, weights).tolist()
    adv, _ = grpo.group_advantages(table, group_size, scale=scale, reward_weights=weights,
                                   multi_objective_aggregation=aggregation)
    return [{"step": step, "group": n // group_size, "task": i.task, "prompt": i.prompt, "completion": t,
             "reward": r, "advantage": float(a), "ratio": None, "clip_fraction": None,
             "tokens": int(ro.mask[n].sum()), "truncated": bool(ro.truncated[n])}
            for n, (i, t, r, a) in enumerate(zip(rows, texts, scores, adv))]


class GroupInspector(_Explorer):
    """G completions for one prompt under the chosen sampling settings; `sample()` draws a new group."""

    css = ("rw-group-inspector", "rw-group-table")

    def __init__(self, model: GPT, records: list[dict], index: int = 0, *, group_size: int = 4,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int | None = None,
                 seed: int = 0, sample: bool = True, reward: str = "graded", scale: str = "group",
                 aggregation: str = "sum_then_normalize"):
        # a value the sliders cannot show would be clamped to their range, silently: refused, or the range widened
        if not records:
            raise ValueError("GroupInspector needs at least one record")
        if not 0 <= index < len(records):
            raise ValueError(f"index {index} is not among the {len(records)} records (0..{len(records) - 1})")
        if not is_int(group_size, 2):  # 2.5 became 2
            raise ValueError(f"GroupInspector needs an integer group_size >= 2, got {group_size!r}")
        if max_new_tokens is not None and not is_int(max_new_tokens, 1):  # -5 sampled a budget of 1
            raise ValueError(f"GroupInspector needs max_new_tokens >= 1 (None: the layout's), got {max_new_tokens!r}")
        SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)  # refuses what the sampler would, by name
        self.model, self.records, self.max_new_tokens, self.seed, self.draws = model, records, max_new_tokens, seed, 0
        self.reward = reward  # the trainer's reward variant (training.reward_functions)
        self.scale, self.aggregation = scale, aggregation  # the trainer's scale_rewards, multi_objective_aggregation
        whole = {"description_width": "initial"}  # labels are not cut to "temperat..."
        self.prompt_slider = W.IntSlider(value=index, min=0, max=len(records) - 1, description="prompt", style=whole)
        self.group_size = W.IntSlider(value=group_size, min=2, max=max(32, group_size), description="G", style=whole)
        self.temperature = W.FloatSlider(value=temperature, min=0.0, max=max(2.0, temperature), step=0.05,
                                         description="temperature", style=whole)
        self.top_k = W.IntSlider(value=top_k, min=0, max=max(100, top_k), description="top-k (0 off)", style=whole)
        self.top_p = W.FloatSlider(value=top_p, min=min(0.05, top_p), max=1.0, step=0.05, description="top-p",
                                   style=whole)
        self.button = W.Button(description="Sample", button_style="primary")
        self.table = W.HTML()
        self.button.on_click(lambda _: self.sample())
        self.button.add_class("rw-sample-button")
        self.table.add_class("rw-group-table")
        self.widget = W.VBox([W.HBox([self.prompt_slider, self.group_size, self.button]),
                              W.HBox([self.temperature, self.top_k, self.top_p]), self.table])
        self.widget.add_class("rw-group-inspector")
        self.rows: list[dict] = []
        self.drawn: dict = {}  # the controls' settings of the group shown
        for c in self._controls().values():  # a changed control marks the shown group as drawn otherwise
            c.observe(lambda _: setattr(self.table, "value", self._table()), names="value")
        if sample:
            self.sample()
        else:
            self.table.value = self._table()  # what to do first, as the snapshot says

    def _controls(self) -> dict:
        return {"prompt": self.prompt_slider, "G": self.group_size, "temperature": self.temperature,
                "top-k": self.top_k, "top-p": self.top_p}

    def sample(self) -> list[dict]:
        """Draw a group with the controls' settings (a new seed each call); return and show its rows."""
        self.rows = sample_groups(self.model, [self.records[self.prompt_slider.value]], self.group_size.value,
                                 temperature=self.temperature.value, top_k=self.top_k.value, top_p=self.top_p.value,
                                 max_new_tokens=self.max_new_tokens, seed=self.seed + self.draws, reward=self.reward,
                                 scale=self.scale, aggregation=self.aggregation)
        self.drawn = {k: c.value for k, c in self._controls().items()}
        self.budget = _group_prompts(self.model, [self.records[self.drawn["prompt"]]], self.max_new_tokens)[2]
        self.draws += 1
        self.table.value = self._table()
        return self.rows

    def _table(self) -> str:
        if not self.rows:
            return "<i>press Sample</i>"
        d = self.drawn
        stale = ("<p style='color:#b00020'><b>The controls have changed since this group was drawn: press Sample."
                 "</b></p>" if d != {k: c.value for k, c in self._controls().items()} else "")
        rows = [[i, _pre(r["completion"]), _fmt(r["reward"]), _fmt(r["advantage"]), _push(r["advantage"]),
                 r["tokens"], "yes" if r["truncated"] else "no"] for i, r in enumerate(self.rows)]
        return (stale + f"<p>prompt #{d['prompt']} ({self.rows[0]['task']}:), G = {d['G']}, temperature {d['temperature']:g}, "
                f"top-k {d['top-k']}, top-p {d['top-p']:g}, at most {self.budget} new tokens; the {self.reward} reward, "
                f"advantages {self.aggregation}, scaled by {self.scale}</p>"
                f"<div><b>prompt</b> {_pre(self.rows[0]['prompt'])}</div>"
                + _table(["#", "completion", "reward", "advantage", "loss pushes log p", "tokens", "truncated"],
                         rows, "rw-completions", "rw-completion", raw=("completion",))
                + "<p>On-policy (the first inner step) the new policy is the sampling policy: every ratio is "
                  "exactly 1, so nothing is clipped and each completion's log-probability is pushed up (A &gt; 0) "
                  "or down (A &lt; 0) in proportion to A. A group with equal rewards has A = 0: no gradient.</p>")


# --- Rollout browser

class RolloutBrowser(_Explorer):
    """A GRPO step's rollout rows as the loss saw them; `select(step)` picks the step."""

    css = ("rw-rollout-browser", "rw-rollout-table")

    def __init__(self, source, step: int | None = None):
        self.all_rows = read_rollouts(source)
        if not self.all_rows:  # a run stopped before it logged a step
            raise ValueError(f"{source if isinstance(source, (str, Path)) else 'rollouts'}: no rollout rows to browse")
        self.steps = sorted({r["step"] for r in self.all_rows})
        # the trainer logs the rollouts of step 1 and every completions_interval-th step: only those are here
        self.slider = W.SelectionSlider(options=self.steps, description=f"step ({len(self.steps)} logged)",
                                        continuous_update=False, style={"description_width": "initial"})
        self.table = W.HTML()
        self.table.add_class("rw-rollout-table")
        self.widget = W.VBox([self.slider, self.table])
        self.widget.add_class("rw-rollout-browser")
        self.step = None
        self.select(self.steps[0] if step is None else step)
        self.slider.observe(lambda ch: self.select(ch["new"]), names="value")

    def select(self, step: int) -> list[dict]:
        """Show one step's rows, group by group; return them."""
        if step not in self.steps:
            raise ValueError(f"step {step} is not in the rollouts (steps {self.steps[0]}..{self.steps[-1]})")
        self.step = step
        self.rows = sorted((r for r in self.all_rows if r["step"] == step), key=lambda r: r["group"])
        self.slider.value = step
        self.table.value = self._table()
        return self.rows

    def _table(self) -> str:
        def clipped(r):
            c = r.get("clip_fraction")
            return "n/a" if c is None else f"yes ({_share(c)} of tokens)" if c > 0 else "no"

        # a group's prompt once, on its first row: the completions get the width
        rows = [[r["group"], r["task"], _pre(r["prompt"]) if i == 0 or self.rows[i - 1]["group"] != r["group"] else "",
                 _pre(r["completion"]), _fmt(r["reward"]), _fmt(r["advantage"]), _push(r["advantage"]),
                 _fmt(r.get("ratio"), ".4f"), clipped(r)] for i, r in enumerate(self.rows)]
        scored = [r["reward"] for r in self.rows if r["reward"] is not None]  # None: no reward function scored it
        mean = _fmt(sum(scored) / len(scored) if scored else None)
        return (f"<p>step {self.step}: {len(self.rows)} completions in {len({r['group'] for r in self.rows})} "
                f"groups, mean reward {mean} (over the {len(scored)} scored). ratio = mean per-token new/old probability ratio "
                f"(n/a before an update); clipped = share of tokens whose ratio the loss clipped.</p>"
                + _table(["group", "task", "prompt", "completion", "reward", "advantage", "loss pushes log p",
                          "ratio", "clipped"], rows, "rw-rollouts", "rw-rollout", raw=("prompt", "completion")))


# --- Notebook 03's figures, and their controls

def clip_region_figure(eps_low: float = 0.2, eps_high: float = 0.2, loss_type: str = "grpo") -> go.Figure:
    """The clipped surrogate against the ratio for A = +-1 (top) and the push it gives the token's
    log-prob, -d loss / d log p (bottom; zero where the clip holds the objective flat)."""
    cfg = grpo.GRPOConfig(loss_type=loss_type, clip_eps_low=eps_low, clip_eps_high=eps_high, max_completion_length=1)
    r = torch.linspace(0.5, 1.5, 201, dtype=torch.float64)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("objective min(rA, clip(r)A) (maximised)",
                                        f"push on log p of that token, -d loss / d log p ({loss_type})"))
    vespo = loss_type == "vespo"  # no clipped objective: each token's log p weighted by a detached phi(r)
    if vespo:
        fig.layout.annotations[0].text = "vespo's detached weight phi(r) of the token's log p (no clipping; ε unused)"
    logr, old, mask = r.log()[:, None], torch.zeros(201, 1, dtype=torch.float64), torch.ones(201, 1, dtype=torch.bool)
    for a, color in ((1.0, "#1f77b4"), (-1.0, "#d62728")):
        adv = torch.full((201,), a, dtype=torch.float64)
        # one one-token completion per ratio; x N undoes the 1/N of every aggregation
        push = -201 * grpo.logprob_gradient(logr, old, adv, mask, config=cfg)[:, 0]
        top = grpo.vespo_weights(logr, old, adv, mask, cfg)[:, 0] if vespo else grpo.policy_objective(r, adv, cfg)
        fig.add_scatter(x=r.tolist(), y=top.tolist(), name=f"A = {a:+.0f}", line_color=color, row=1, col=1)
        xs, ys = _break_at_jumps(r.tolist(), push.tolist())
        fig.add_scatter(x=xs, y=ys, name=f"A = {a:+.0f}", line_color=color, showlegend=False, row=2, col=1)
    if vespo:
        peaks = (cfg.vespo_k_pos / cfg.vespo_lambda_pos, cfg.vespo_k_neg / cfg.vespo_lambda_neg)  # phi's maximum: r = k / λ
        fig.update_layout(title=f"vespo: no clip range; the push φ(r)·A peaks at r = k/λ ({peaks[0]:.2f} for A > 0, "
                                f"{peaks[1]:.2f} for A < 0)", height=560)
    else:
        for x in (1 - eps_low, 1 + eps_high):
            fig.add_vline(x=x, line_dash="dot")
        fig.update_layout(title=f"Clip range [{1 - eps_low:.2f}, {1 + eps_high:.2f}]: flat (no gradient) on one "
                                "side per sign of A", height=560)
    return fig.update_xaxes(title_text="ratio r = π_θ / π_old", row=2, col=1)


def _break_at_jumps(xs: list[float], ys: list[float], jump: float = 0.1) -> tuple[list, list]:
    """The points with a gap (None) wherever y jumps by more than `jump` between neighbours: plotly
    would join the two sides of the clip's step with a sloped segment, as if the push faded over a range
    (between the grid's points the curves move by at most |A| x 0.005)."""
    out_x, out_y = xs[:1], ys[:1]
    for x0, y0, x, y in zip(xs, ys, xs[1:], ys[1:]):
        if abs(y - y0) > jump:
            out_x.append((x0 + x) / 2)
            out_y.append(None)
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


def length_bias_weights(lengths: list[int]) -> dict[str, torch.Tensor]:
    """grpo.aggregation_weights [N, max(lengths)] (float64) for completions of these lengths, per loss type."""
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return {lt: grpo.aggregation_weights(mask, grpo.GRPOConfig(loss_type=lt, max_completion_length=max(lengths)),
                                         dtype=torch.float64) for lt in grpo.LOSS_TYPES}


def _group_lengths(short_len: int, long_len: int, group_size: int) -> list[int]:
    assert group_size >= 2 and 1 <= short_len < long_len, "a group of at least two, from short to long"
    return [round(short_len + (long_len - short_len) * i / (group_size - 1)) for i in range(group_size)]


def length_bias_figure(short_len: int = 5, long_len: int = 40, group_size: int = 2, loss_type: str | None = None) -> go.Figure:
    """Per-token and whole-completion weight of G completions with lengths from short_len to long_len,
    one line per loss type (`loss_type` drawn bold)."""
    lengths = _group_lengths(short_len, long_len, group_size)
    w = length_bias_weights(lengths)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("weight of one token", "weight of the whole completion"))
    for lt, x in w.items():
        i = grpo.LOSS_TYPES.index(lt)  # a dash of its own too: several loss types weigh tokens alike, lines overlap
        line = dict(width=4 if lt == loss_type else 2, color=series_colour(i), dash=("solid", "dot", "dash", "longdash", "dashdot")[i % 5])
        fig.add_scatter(x=lengths, y=x[:, 0].tolist(), name=lt, mode="lines+markers", line=line, legendgroup=lt, row=1, col=1)
        fig.add_scatter(x=lengths, y=x.sum(1).tolist(), name=lt, mode="lines+markers", line=line, legendgroup=lt,
                        showlegend=False, row=1, col=2)
    alike: list[list[str]] = []  # loss types whose lines coincide, said in the title (only the top one shows)
    for lt, x in w.items():
        if same := next((g for g in alike if torch.allclose(w[g[0]], x)), None):
            same.append(lt)
        else:
            alike.append([lt])
    overlap = "; ".join(" = ".join(g) for g in alike if len(g) > 1)
    fig.update_layout(title=f"Length bias: a group of {group_size} completions, {short_len} to {long_len} tokens"
                            + (f"<br><sup>the same weights, one line on top of the other: {overlap}</sup>" if overlap else ""))
    fig.update_xaxes(title_text="completion length (tokens)")
    return fig


class ClipControls(_Explorer):
    """Sliders for eps low / high, loss type and group size over notebook 03's two figures."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, loss_type: str = "grpo", group_size: int = 4,
                 short_len: int = 5, long_len: int = 40):
        self.short_len, self.long_len = short_len, long_len
        self.eps_low = W.FloatSlider(value=eps_low, min=0.0, max=0.9, step=0.01, description="ε low")
        self.eps_high = W.FloatSlider(value=eps_high, min=0.0, max=1.0, step=0.01, description="ε high")
        self.loss_type = W.Dropdown(options=grpo.LOSS_TYPES, value=loss_type, description="loss_type")
        self.group_size = W.IntSlider(value=group_size, min=2, max=max(64, group_size), description="G")
        # a FigureWidget only where a frontend draws it: a headless kernel would save each one's state,
        # plotly.js included (5 MB), into the executed notebook
        live = _live()
        self.clip_fig, self.length_fig = (go.FigureWidget(), go.FigureWidget()) if live else (go.Figure(), go.Figure())
        self.widget = W.VBox([W.HBox([self.eps_low, self.eps_high]), W.HBox([self.loss_type, self.group_size]),
                              *((self.clip_fig, self.length_fig) if live else ())])
        self.widget.add_class("rw-clip-controls")
        self.update()
        for c in (self.eps_low, self.eps_high, self.loss_type, self.group_size):
            c.observe(lambda _: self.update(), names="value")

    def update(self) -> tuple[go.Figure, go.Figure]:
        """Redraw both figures from the controls; return them (static copies)."""
        lt = self.loss_type.value
        figs = (clip_region_figure(self.eps_low.value, self.eps_high.value, lt),
                length_bias_figure(self.short_len, self.long_len, self.group_size.value, lt))
        for live, fig in zip((self.clip_fig, self.length_fig), figs):
            with live.batch_update():
                live.data = ()
                live.add_traces(fig.data)
                live.layout = fig.layout
        self.figures = figs
        return figs

    def html(self) -> str:
        """The settings and the per-token weights by completion length (the figures are saved apart)."""
        lengths = _group_lengths(self.short_len, self.long_len, self.group_size.value)
        rows = [[lt, *(f"{x:.4g}" for x in w[:, 0].tolist())] for lt, w in length_bias_weights(lengths).items()]
        return (f"<div class='rw-clip-controls'><p>clip range [{1 - self.eps_low.value:.2f}, {1 + self.eps_high.value:.2f}],"
                f" loss_type {self.loss_type.value}, G = {self.group_size.value}; weight of one token by length:</p>"
                + _table(["loss_type", *map(str, lengths)], rows, "rw-length-weights") + "</div>")

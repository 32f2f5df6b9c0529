"""The run's dashboard in trackio, Hugging Face's local tracker: what a run logs there, and the local server.

    python analyze.py --dashboard grpo_runs     # or `make dashboard`: every run under grpo_runs, 127.0.0.1

With GRPO_REPORT_TO=trackio (the default) transformers logs each step to trackio through its TrackioCallback.
`install` replaces that callback by ours, which logs under the names learning.log uses (reward, reward_std,
loss, grad_norm, lr, entropy, frac_zero_std), the share of completions ending at each reward stage, each
held-out evaluation, the run-health monitor's WARNING and OK lines as trackio alerts, and a table of the
step's completions (problem, reward, stage, the toolchain's message, advantage, the completion). trackio keeps
it all in a SQLite file under TRACKIO_DIR (default GRPO_OUTPUT_DIR/trackio/); nothing is sent anywhere.

trackio reads TRACKIO_DIR once, when it is first imported (TRL imports it with GRPOTrainer), so `keep_local`
runs before that. No torch here; transformers and trackio are imported only where a run uses them.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from envflags import ConfigError
from rewards import STAGES, completion_text
from run_records import SAMPLED_ZERO_STD

PROJECT = "ocaml-grpo"
HOST = "127.0.0.1"
# trackio sends a run to a Hugging Face Space, a Bucket, a server or a webhook only when one of these is set.
REMOTE_SETTINGS = (
    "TRACKIO_SPACE_ID",
    "TRACKIO_SERVER_URL",
    "TRACKIO_BUCKET_ID",
    "TRACKIO_DATASET_ID",
    "TRACKIO_WEBHOOK_URL",
)
# learning.log's names for TRL's metrics, in the order a reader looks for them.
STEP_METRICS = {
    "reward": "train/reward",
    "reward_std": "train/reward_std",
    "frac_reward_zero_std": "train/frac_zero_std",
    "entropy": "train/entropy",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/lr",
}
SFT_METRICS = {
    "loss": "sft/loss",
    "mean_token_accuracy": "sft/token_accuracy",
    "grad_norm": "sft/grad_norm",
    "learning_rate": "sft/lr",
}
# The dashboard's sections and plots in the order a reader looks for them (trackio sorts by name otherwise).
PLOT_ORDER = (
    *STEP_METRICS.values(),
    *(f"stage share/{stage}" for stage in STAGES),
    *(f"held-out/{name}" for name in ("pass@1", "reward", "reward_std")),
    *(f"held-out stage share/{stage}" for stage in STAGES),
    *SFT_METRICS.values(),
)
TABLE_COLUMNS = ("step", "problem", "reward", "stage", "message", "advantage", "completion")
# The dashboard shows this many characters of a table cell: a whole completion of the seed's 512 tokens.
CELL_CHARS = 4000


def trackio_dir(output_dir: str | Path, setting: str | None = None) -> Path:
    """Where a run's trackio data lives: TRACKIO_DIR when set, else next to the run's other logs."""
    return Path(setting).expanduser() if setting else Path(output_dir) / "trackio"


def keep_local(cfg) -> str | None:
    """With GRPO_REPORT_TO=trackio, point trackio at the run's folder for it before trackio is imported, and
    refuse the settings that would make it send the run somewhere. Returns the line to note: where the data
    goes and how to watch it, or that trackio, imported earlier in this process, keeps the folder it read
    then. None for other trackers."""
    if cfg.report_to != "trackio":
        return None
    remote = [name for name in REMOTE_SETTINGS if os.environ.get(name)]
    if remote:
        raise ConfigError(
            f"{remote[0]}={os.environ[remote[0]]!r}: ocaml-grpo keeps trackio's data local; unset it, or "
            "use GRPO_REPORT_TO=none"
        )
    directory = trackio_dir(cfg.output_dir, cfg.trackio_dir)
    os.environ["TRACKIO_DIR"] = str(directory)
    if "trackio.utils" in sys.modules:
        current = Path(sys.modules["trackio.utils"].TRACKIO_DIR)
        if current.resolve() != directory.resolve():
            return f"dashboard: trackio was imported earlier in this process and logs to {current}"
    watch = cfg.trackio_dir or cfg.output_dir
    return f"dashboard: trackio logs to {directory}; watch it with python analyze.py --dashboard {watch}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """trackio prints a banner on every init, finish and alert; our console has its own lines for them."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def readable_metrics(logs: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, float]:
    """A logging step's numbers under the dashboard's names: learning.log's for the headline metrics, `stage
    share/<stage>` for the reward stages, `trl/<name>` for the rest of what TRL logs."""
    if SAMPLED_ZERO_STD in logs and "frac_reward_zero_std" in names:
        # Dynamic sampling: learning.log's frac_zero_std is the share of sampled groups that tied (the
        # seed's meaning); TRL's counts the trained groups only and keeps its own name.
        names = {**names, SAMPLED_ZERO_STD: names["frac_reward_zero_std"]}
        names.pop("frac_reward_zero_std")
    metrics = {}
    for key, value in logs.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key in names:
            name = names[key]
        elif key.startswith("stages/"):
            name = "stage share/" + key.removeprefix("stages/")
        else:
            name = "trl/" + key
        metrics[name] = float(value)
    return metrics


def eval_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A held-out evaluation's row of metrics.jsonl (eval/pass@1, eval/reward, eval/stages/...) for the
    dashboard: `held-out/pass@1`, `held-out/reward`, `held-out stage share/<stage>` (the counts of problems
    and samples are in learning.log's line)."""
    metrics = {}
    for key, value in row.items():
        if not key.startswith("eval/") or key in ("eval/problems", "eval/samples"):
            continue
        name = key.removeprefix("eval/")
        if name.startswith("stages/"):
            metrics["held-out stage share/" + name.removeprefix("stages/")] = float(value)
        else:
            metrics["held-out/" + name] = float(value)
    return metrics


def completion_rows(step: int, completion_log: Mapping[str, Any], reward_name: str) -> list[list[Any]]:
    """One row per completion of the step's round, from TRL's completion log (the record its log_completions
    table is built from): its completion, reward and advantage, and the columns the reward adds to it."""
    completions = list(completion_log["completion"])
    rewards = list(completion_log["rewards"].get(reward_name, []))
    advantages = list(completion_log["advantages"])
    extra = completion_log["extra"]
    column = lambda name: list(extra.get(name, []))
    problems, stages, messages = column("problem_id"), column("stage"), column("message")
    at = lambda values, i: values[i] if i < len(values) else None
    return [
        [
            step,
            at(problems, i),
            _rounded(at(rewards, i)),
            at(stages, i),
            at(messages, i),
            _rounded(at(advantages, i)),
            completion_text(text),
        ]
        for i, text in enumerate(completions)
    ]


def _rounded(value: Any) -> float | None:
    return None if value is None or math.isnan(float(value)) else round(float(value), 4)


def install(trainer, run_name: str, settings: Mapping[str, Any], reward_name: str | None = None):
    """Replace transformers' TrackioCallback on `trainer` (GRPO_REPORT_TO=trackio put it there) by ours, and
    return ours; None when the run does not report to trackio. `settings` (the run's TrainConfig as a dict)
    are the run's config on the dashboard. `reward_name` (GRPO) adds the completions table, read from the
    trainer's completion log after each logging step. Call `finish()` on it after `trainer.train()`: the last
    held-out evaluation comes after the trainer's own end-of-training events."""
    from transformers.integrations import TrackioCallback

    if not any(isinstance(cb, TrackioCallback) for cb in trainer.callback_handler.callbacks):
        return None

    class RunDashboard(TrackioCallback):
        """TrackioCallback with our run name and names, a quiet console, alerts and the completions table."""

        started = False  # a trackio run is open in this process (the main one)

        def setup(self, args, state, model, **kwargs):
            if state.is_world_process_zero and not self.started:
                with _quiet():
                    self._trackio.init(project=PROJECT, name=run_name, resume="allow", embed=False)
                    self._trackio.config.update(dict(settings), allow_val_change=True)
                self.started = True
            self._initialized = True

        def on_log(self, args, state, control, model=None, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "loss" not in logs:
                return  # the end-of-training summary is in metrics.jsonl
            if not self._initialized:
                self.setup(args, state, model)
            names = STEP_METRICS if reward_name else SFT_METRICS
            self._trackio.log(readable_metrics(logs, names), step=state.global_step)
            completion_log = getattr(trainer, "_logs", None)
            if reward_name and completion_log and completion_log["completion"]:
                rows = completion_rows(state.global_step, completion_log, reward_name)
                table = self._trackio.Table(data=rows, columns=list(TABLE_COLUMNS))
                self._trackio.log({"completions": table}, step=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            pass  # finish() ends the run, after the last evaluation

        def finish(self) -> None:
            if self.started:
                with _quiet():
                    self._trackio.finish()
                self.started = False

        def add_eval(self, row: Mapping[str, Any]) -> None:
            """A held-out evaluation (its metrics.jsonl row) at its step."""
            if self.started:
                self._trackio.log(eval_metrics(row), step=int(row["step"]))

        def alert(self, level: str, title: str, text: str) -> None:
            """A run-health monitor's line as an alert (its HealthMonitor's `alert`): `level` warn or info."""
            if self.started:
                with _quiet():
                    self._trackio.alert(title, text, level=self._trackio.AlertLevel(level))

    trainer.remove_callback(TrackioCallback)
    board = RunDashboard()
    trainer.add_callback(board)
    return board


# ------------------------------------------------------------------------------------------------------------
# The dashboard server


def trackio_folders(root: Path) -> list[Path]:
    """The trackio folders of the runs under `root`: root itself when it holds trackio's files, root/trackio,
    and the trackio/ folder of every run folder up to two levels below (grpo_runs/demo/trackio)."""
    candidates = [root, root / "trackio", *sorted(root.glob("*/trackio")), *sorted(root.glob("*/*/trackio"))]
    found = []
    for folder in candidates:
        if folder.is_dir() and any(folder.glob("*.db")) and folder.resolve() not in found:
            found.append(folder.resolve())
    return found


def project_name(folder: Path, root: Path) -> str:
    """The dashboard's name for one trackio folder: its run folder's path below root, or the run folder's own
    name for root's, in the characters trackio keeps in a project name."""
    root = root.resolve()
    run_folder = folder.parent if folder.name == "trackio" else folder
    if folder == root or run_folder == root:
        name = run_folder.name
    else:
        name = "-".join(run_folder.relative_to(root).parts)
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "runs"


def dashboard_folder(root: Path, view: Path) -> list[str]:
    """Fill `view` with one link per run folder's trackio database, named after the run folder, so that one
    trackio server shows them all, each as a project, live: the links point at the files training writes.
    Returns the project names."""
    projects = []
    for folder in trackio_folders(root):
        for db in sorted(folder.glob("*.db")):
            name = project_name(folder, root)
            name = name if db.stem == PROJECT else f"{name}-{db.stem}"
            (view / f"{name}.db").symlink_to(db.resolve())
            projects.append(name)
    return projects


def start(root: Path, view: Path, port: int | None = None) -> tuple[Any, str, list[str]]:
    """Start trackio's dashboard on 127.0.0.1 for the runs under `root`: (server, url, projects). The server
    runs in a thread until `server.close()`. Must run before trackio is imported in this process."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder")
    projects = dashboard_folder(root, view)
    if not projects:
        raise ConfigError(
            f"{root}: no trackio data under it (a run with GRPO_REPORT_TO=trackio writes "
            "GRPO_OUTPUT_DIR/trackio/)"
        )
    if "trackio.utils" in sys.modules:
        raise RuntimeError("trackio was imported before the dashboard chose its folder")
    os.environ["TRACKIO_DIR"] = str(view)
    os.environ["TRACKIO_TABLE_TRUNCATE_LENGTH"] = str(CELL_CHARS)
    os.environ["TRACKIO_PLOT_ORDER"] = ",".join(PLOT_ORDER)
    for name in REMOTE_SETTINGS:
        os.environ.pop(name, None)
    import trackio

    with _quiet():
        server, url, _share, _full = trackio.show(
            project=projects[0],
            open_browser=False,
            block_thread=False,
            host=HOST,
            share=False,
            mcp_server=False,
            server_port=port,  # None: the first free one from 7860 (GRADIO_SERVER_PORT)
        )
    return server, f"{url.rstrip('/')}/?project={projects[0]}", projects


def report_line(run_folder: Path) -> str:
    """The run report's pointer to the dashboard."""
    command = f"python analyze.py --dashboard {run_folder}"
    if trackio_folders(Path(run_folder)):
        return f"Watch it in the dashboard: `{command}` (or `make dashboard`), see docs/dashboard.md."
    return (
        "No dashboard data in this folder: GRPO_REPORT_TO=trackio writes it to trackio/ here, or to "
        "TRACKIO_DIR when set (`python analyze.py --dashboard TRACKIO_DIR`)."
    )


def serve(root: Path, port: int | None = None) -> int:
    """`make dashboard`: serve the runs under `root` until Ctrl-C."""
    # A background job of a non-interactive shell (`make dashboard &` in a script, CI) starts with SIGINT
    # ignored, and Python then raises no KeyboardInterrupt: Ctrl-C (kill -INT) must stop it all the same.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="ocaml-grpo-dashboard-") as view:
        try:
            server, url, projects = start(root, Path(view), port)
        except (ConfigError, OSError) as err:  # OSError: the port is taken
            print(f"error: {err}", file=sys.stderr)
            return 2
        try:  # from here on: a Ctrl-C the moment the line is out lands here too
            print(f"Dashboard of {', '.join(projects)} at {url}  (Ctrl-C stops it)", flush=True)
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("dashboard stopped")
        finally:
            server.close()
    return 0

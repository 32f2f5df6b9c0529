"""The trackio dashboard: a short real run logs to GRPO_OUTPUT_DIR/trackio, `analyze.py --dashboard` serves it
on 127.0.0.1, and headless Chromium (Debian's `chromium`) renders the run, its metrics, the health alerts and
the completions from it, with no network but the loopback."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState

import analyze
import dashboard
import monitor
from envflags import ConfigError
from health_bands import SEED
from problems import BUNDLED_PROBLEMS, ROOT
from rewards import STAGES, RewardConfig, completion_message, score_completion
from settings import TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is missing: `make test` installs it (apt-get install chromium)")
    return found


def render(url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The page's text once its scripts have run, as headless Chromium renders it. Every host name but
    127.0.0.1 resolves to nothing, so the page can reach nothing else."""
    command = [
        chromium(),
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=15000",
        "--window-size=1400,1000",
        *(["--no-sandbox"] if os.geteuid() == 0 else []),  # Chromium's sandbox refuses to run as root
        f"--screenshot={screenshot}" if screenshot else "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", result.stdout, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def short_run(tiny_model: Path, out: Path) -> subprocess.CompletedProcess:
    """Five GRPO steps of the tiny model (enough for the health monitor to judge), held-out evaluations at
    steps 0 and 5, reporting to trackio by default; the hub unreachable on purpose."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "TRACKIO_", "SFT_"))}
    env["HF_HUB_OFFLINE"] = "1"
    argv = [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)),
        *("--output-dir", str(out), "--batch-size", "2", "--num-generations", "2", "--max-completion", "12"),
        *("--max-steps", "5", "--save-steps", "5", "--lora-r", "4", "--lora-alpha", "8"),
        *("--eval-dataset", "none", "--eval-holdout", "2", "--eval-steps", "5"),
    ]
    return subprocess.run(
        [sys.executable, "train.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_a_run_is_watched_in_the_dashboard_in_a_real_browser(tiny_model: Path, tmp_path: Path) -> None:
    runs = tmp_path / "grpo_runs"
    run = short_run(tiny_model, runs / "first")
    assert run.returncode == 0, run.stderr[-3000:]
    console = run.stdout + run.stderr
    # trackio's banners and TRL's rich table of completions stay off the console
    assert not re.search(r"\* Trackio|\* Created new run|trackio show|TRACKIO|┏|╭", console), console[-3000:]
    assert (runs / "first" / "trackio" / "ocaml-grpo.db").is_file()
    log = (runs / "first" / "learning.log").read_text(encoding="utf-8")
    assert f"# dashboard: trackio logs to {runs / 'first' / 'trackio'}" in log
    health = [line for line in log.splitlines() if line.startswith(("WARNING [Epoch", "OK [Epoch"))]
    assert health, log  # five steps of a random model, every group tied at 0: the stop criteria hold
    breakdown = (runs / "first" / "reward_logs" / "syntax_aware_breakdown.jsonl").read_text(encoding="utf-8")
    problem_ids = {str(json.loads(line)["problem_id"]) for line in breakdown.splitlines()}
    report, _ = analyze.write_report(analyze.load_run(runs / "first"))
    assert f"## Dashboard\n\nWatch it in the dashboard: `python analyze.py --dashboard {runs / 'first'}`" in (
        report.markdown
    )

    server = start_dashboard(runs)
    try:
        first = server.stdout.readline()
        found = re.match(r"Dashboard of first at (http://127\.0\.0\.1:\d+/)\?project=first  \(Ctrl-C", first)
        assert found, first + server.stdout.read() if server.poll() is not None else first
        base = found[1]
        page = render(f"{base}?project=first", tmp_path / "chromium")
        assert "Project first" in page and "first" in page.split("Runs (1)", 1)[1]  # the run
        for section, metric in (("train", "reward"), ("train", "frac_zero_std"), ("held-out", "pass@1")):
            assert re.search(rf"▾ {re.escape(section)} \(\d+\).* {re.escape(metric)} first", page), page
        assert re.search(r"▾ stage share \(8\)", page), page
        # the alert's title, as the line starts: `entropy=3.2` (over its band), `stop criteria hold` (: why)
        title = re.split(r" over |: ", health[0].split("] ", 1)[1], maxsplit=1)[0]
        assert f"Alerts ({len(health)})" in page and title in page, page  # the health monitor's lines

        tables = render(f"{base}media?project=first", tmp_path / "chromium")
        assert "completions first, Step: 5" in tables, tables
        header = "step problem reward stage message advantage completion"
        assert header in tables, tables
        rows = tables.split(header, 1)[1]
        assert any(f"5 {pid} 0 gated " in rows for pid in problem_ids), rows[:2000]  # a completion of step 5

        screenshot = tmp_path / "dashboard.png"
        render(f"{base}?project=first", tmp_path / "chromium", screenshot=screenshot)
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    finally:
        rest = ctrl_c(server)
    assert server.returncode == 0 and "dashboard stopped" in rest, rest


def test_ctrl_c_stops_the_dashboard_even_when_its_shell_ignored_sigint(tmp_path: Path) -> None:
    """A background job of a non-interactive shell (`make test &`, `make dashboard &` in a script) starts
    with SIGINT ignored, exec keeps it ignored, and Python then raises no KeyboardInterrupt: the browser
    test's server outlived its Ctrl-C that way in CI, the suite having been started in the background."""
    (tmp_path / "trackio").mkdir()
    (tmp_path / "trackio" / f"{dashboard.PROJECT}.db").touch()
    ignoring = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    server = start_dashboard(tmp_path, launcher=[sys.executable, "-c", ignoring])
    first = server.stdout.readline()
    rest = ctrl_c(server, wait=10)
    assert "(Ctrl-C stops it)" in first, first + rest
    assert server.returncode == 0 and rest == "dashboard stopped\n", rest


def start_dashboard(runs: Path, launcher: list[str] = ()) -> subprocess.Popen:
    """`analyze.py --dashboard runs` on a free port, started through `launcher`, its console piped."""
    command = [*launcher, sys.executable, "analyze.py", "--dashboard", str(runs), "--port", str(free_port())]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ctrl_c(server: subprocess.Popen, wait: float = 30) -> str:
    """Ctrl-C to the server; the rest of its console. A server still up after `wait` seconds is killed (never
    left behind), and its console then lacks `dashboard stopped`."""
    server.send_signal(signal.SIGINT)
    try:
        return server.communicate(timeout=wait)[0]
    except subprocess.TimeoutExpired:
        server.kill()
        return server.communicate()[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_dashboard_names_metrics_as_learning_log_does() -> None:
    logs = {"loss": 0.1, "grad_norm": 0.2, "learning_rate": 5e-6, "reward": 0.4, "reward_std": 0.1}
    logs |= {
        "entropy": 0.15,
        "frac_reward_zero_std": 0.25,
        "stages/passed": 0.5,
        "completions/mean_length": 9,
    }
    metrics = dashboard.readable_metrics(logs, dashboard.STEP_METRICS)
    assert metrics == {
        "train/loss": 0.1,
        "train/grad_norm": 0.2,
        "train/lr": 5e-6,
        "train/reward": 0.4,
        "train/reward_std": 0.1,
        "train/entropy": 0.15,
        "train/frac_zero_std": 0.25,
        "stage share/passed": 0.5,
        "trl/completions/mean_length": 9.0,
    }
    row = {"step": 20, "epoch": 0.5, "eval/problems": 48, "eval/samples": 1, "eval/pass@1": 0.25}
    row |= {"eval/reward": 0.5, "eval/reward_std": 0.2, **{f"eval/stages/{s}": 0.125 for s in STAGES}}
    evals = dashboard.eval_metrics(row)
    assert evals["held-out/pass@1"] == 0.25 and evals["held-out/reward"] == 0.5
    assert {k for k in evals if k.startswith("held-out stage share/")} == {
        f"held-out stage share/{s}" for s in STAGES
    }
    assert "held-out/problems" not in evals


def test_health_lines_become_alerts_named_by_their_metric() -> None:
    lines: list[str] = []
    alerts: list[tuple[str, str, str]] = []
    health = monitor.HealthMonitor(
        lines.append, False, alert=lambda *alert: alerts.append(alert), profile=SEED
    )
    state = TrainerState(is_world_process_zero=True)
    for step, entropy in enumerate([3.0] * 10 + [0.15] * 20, 1):  # too high, then back within the band
        state.global_step, state.epoch = step, step / 100
        health.on_log(
            None, state, TrainerControl(), logs={"reward": 0.5, "reward_std": 0.1, "entropy": entropy}
        )
    assert [text for _, _, text in alerts] == lines  # every line the monitor writes, as an alert
    entropy = [(level, title) for level, title, text in alerts if text.split("] ")[1].startswith("entropy=")]
    assert entropy == [("warn", "entropy=3"), ("info", "entropy=0.15")]


def test_the_message_column_says_what_the_toolchain_said() -> None:
    problem = "(** Add one. *)\nlet f (n : int) : int ="
    tests = "let () = assert (f 1 = 2)"
    wrong = '```ocaml\nlet f (n : int) : int =\n  n + "one"\n(* END *)\n```'
    breakdown = score_completion(problem, tests, wrong, cfg=RewardConfig(min_non_empty_lines=1))
    assert breakdown["stage"] == "type_error"
    message = completion_message(breakdown)
    assert message.startswith("1 type error: ") and "\n" not in message and "string" in message


def test_runs_never_go_to_the_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = TrainConfig(output_dir=str(tmp_path / "run"))
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "elsewhere"))  # restored after the test
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/space")
    with pytest.raises(ConfigError, match=r"^TRACKIO_SPACE_ID='someone/space': ocaml-grpo keeps trackio"):
        dashboard.keep_local(cfg)
    monkeypatch.delenv("TRACKIO_SPACE_ID")
    assert dashboard.keep_local(TrainConfig(output_dir=str(tmp_path / "run"), report_to="none")) is None
    note = dashboard.keep_local(cfg)
    assert os.environ["TRACKIO_DIR"] == str(tmp_path / "run" / "trackio")
    if "trackio.utils" in sys.modules:  # trackio read its folder when another test imported it
        assert note.startswith("dashboard: trackio was imported earlier in this process and logs to ")
    else:
        watch = f"python analyze.py --dashboard {tmp_path / 'run'}"
        assert note == f"dashboard: trackio logs to {tmp_path / 'run' / 'trackio'}; watch it with {watch}"


def test_the_dashboard_finds_each_run_folder_and_names_it(tmp_path: Path) -> None:
    for folder in ("grpo_runs/trackio", "grpo_runs/demo/trackio", "grpo_runs/seeds/s1/trackio"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "ocaml-grpo.db").touch()
    (tmp_path / "grpo_runs" / "empty" / "trackio").mkdir(parents=True)
    view = tmp_path / "view"
    view.mkdir()
    assert dashboard.dashboard_folder(tmp_path / "grpo_runs", view) == ["grpo_runs", "demo", "seeds-s1"]
    assert (view / "demo.db").resolve() == (tmp_path / "grpo_runs" / "demo" / "trackio" / "ocaml-grpo.db")
    with pytest.raises(ConfigError, match="no trackio data under it"):
        dashboard.start(tmp_path / "grpo_runs" / "empty", view)


def test_make_dashboard_without_data_says_so_in_one_line(tmp_path: Path, run_python) -> None:
    result = run_python("analyze.py", "--dashboard", str(tmp_path), timeout=120)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {tmp_path}: no trackio data under it (a run with GRPO_REPORT_TO=trackio writes "
        "GRPO_OUTPUT_DIR/trackio/)\n"
    )
    assert "No dashboard data in this folder" in dashboard.report_line(tmp_path)


def test_with_dynamic_sampling_frac_zero_std_is_the_sampled_share_as_in_learning_log() -> None:
    logs = {"frac_reward_zero_std": 0.0, "dynamic/frac_zero_std_sampled": 0.4, "reward": 0.5}
    metrics = dashboard.readable_metrics(logs, dashboard.STEP_METRICS)
    assert metrics["train/frac_zero_std"] == 0.4  # the seed's meaning, what learning.log prints
    assert metrics["trl/frac_reward_zero_std"] == 0.0  # TRL's share of the trained groups, by its own name
    assert dashboard.readable_metrics({"frac_reward_zero_std": 0.25}, dashboard.STEP_METRICS) == {
        "train/frac_zero_std": 0.25
    }

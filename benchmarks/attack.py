"""Random-kill attack (issue 20): kill `planner run` and `planner worker` processes at random
moments, resume, and check after every kill that nothing is lost, duplicated, stuck or orphaned.

    python benchmarks/attack.py --kills 200 --seed 1          # about 25 min on 2 cores
    python benchmarks/attack.py --quick                        # 20 kills, about 3 min

Modes (the kills are spread evenly over them): ``serial-exhaustive``, ``jobs2-exhaustive``,
``serial-tpe``, ``jobs2-tpe`` on a fresh journal each round, and ``pg-workers`` (two `planner
worker` processes on PostgreSQL; needs ``PLANNER_TEST_POSTGRES``, else skipped and said so).
A round starts the run, kills it at a random moment (SIGKILL mostly, sometimes SIGTERM or
SIGINT), resumes it and may kill the resume too (1 to 3 kills a round), then resumes to the end.
Every estimate is slowed by ``--slow-s`` (a ``sitecustomize`` on the children's PYTHONPATH, as
tests/test_liveness.py does) so that the kills land mid-run.

Checked after every kill: no process of the round is left (every live process whose environment
holds the round's tag), the finished trials are a superset of those seen before the kill (same
number, plan and values), no plan stored twice (exhaustive), at most ``n_trials`` finished
(sampler). At the end of a round: the resume exited 0 within its timeout, every plan stored
exactly once (exhaustive) or exactly ``n_trials`` finished (sampler), no RUNNING or WAITING trial
left; no Python traceback on stderr. Prints a table (mode, rounds, kills by signal, kills that
came too late, violations by kind) and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna
from optuna.trial import TrialState

optuna.logging.set_verbosity(optuna.logging.ERROR)

SLOW = """\
import os
import sys
if os.environ.get("PLANNER_TEST_SLOW_S"):
    import importlib.machinery
    import time
    _delay = float(os.environ["PLANNER_TEST_SLOW_S"])

    def _patch(module):
        if module.__name__ == "planner.run_exhaustive":
            module.PARALLEL_MIN = 0  # --jobs 2 uses its workers, several chunks each
            module.CHUNK = 250
            return
        call, frame = module.Evaluator.__call__, module.Evaluator.frame

        def slow(self, strategy):
            time.sleep(_delay)
            return call(self, strategy)

        def slow_frame(self, strategies):
            time.sleep(_delay * len(strategies))
            return frame(self, strategies)

        module.Evaluator.__call__, module.Evaluator.frame = slow, slow_frame

    class _Slow:
        # patches the modules when the planner imports them, not at start-up: importing them
        # here (numpy with them) made Python's own start-up long, and a Ctrl-C there is a
        # fatal error of the interpreter's, not the planner's to handle
        def find_spec(self, name, path, target=None):
            if name not in ("planner.record", "planner.run_exhaustive"):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None:
                return None
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Slow())
"""
LAB = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
hbm_gb: 80
objectives: [step_time]
sampler: {sampler}
n_trials: {n_trials}
seed: 3
space:
  tp: powers_of_two
  sp: powers_of_two
  recompute: [none, full]
"""
"""The lab's 56 strategies (tests/study_files.py)."""
MID = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
sampler: exhaustive
space:
  tp: powers_of_two
  pp: [1, 2, 4, 8]
  sp: powers_of_two
  zero: [0, 3]
  recompute: [none, full]
  micro_batch: [1, 2]
"""
"""592 strategies, 60 work items of 10 (tests/test_workers_postgres.py)."""
N_TRIALS = 30
MODES = ("serial-exhaustive", "jobs2-exhaustive", "serial-tpe", "jobs2-tpe", "pg-workers")
SIGNALS = ((signal.SIGKILL, 0.7), (signal.SIGTERM, 0.15), (signal.SIGINT, 0.15))
EXIT_S = 60.0
"""How long a process may take to end after SIGTERM / SIGINT, or a resume to finish its work,
before it counts as a hang."""
RESUME_S = 300.0
KINDS = ("lost", "twice", "stuck", "hang", "orphan", "traceback")
"""Violations: a finished trial lost; a plan stored twice (or more than n_trials finished); a
study not finished by its resume (RUNNING or WAITING trials left, plans missing, the resume
failing); a process not ending; a process left behind; a Python traceback on stderr."""


def _kind(text: str) -> str:
    """The kind of a violation, from its text."""
    for kind, words in (("lost", ("lost",)), ("twice", ("twice", "distinct", "for n_trials")),
                        ("hang", ("hang",)), ("orphan", ("processes left",)),
                        ("traceback", ("traceback",))):
        if any(w in text for w in words):
            return kind
    return "stuck"


@dataclass
class Tally:
    rounds: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    missed: int = 0
    """Runs that ended before their kill moment (not counted as kills)."""
    violations: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    """Violations by kind (:data:`KINDS`)."""


@dataclass(frozen=True)
class Finished:
    """What identifies a finished trial: kept across kills."""

    number: int
    plan: str
    values: tuple[float, ...]


# -- processes ---------------------------------------------------------------------------------
def _env(tag: str, site: Path, slow: float) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}", PLANNER_TEST_SLOW_S=str(slow),
               PLANNER_ATTACK_TAG=tag)
    env.pop("PLANNER_STORAGE", None)
    return env


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *args, "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _tagged(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment holds the round's tag."""
    needle = f"PLANNER_ATTACK_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _orphans(tag: str, within_s: float = 5.0) -> list[int]:
    """Processes of the round still alive ``within_s`` after its processes were ended."""
    deadline = time.monotonic() + within_s
    while (alive := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _kill_all(tag: str) -> None:
    for pid in _tagged(tag):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _signal(rng: random.Random) -> signal.Signals:
    x, total = rng.random(), 0.0
    for sig, weight in SIGNALS:
        total += weight
        if x < total:
            return sig
    return signal.SIGKILL


def _hit(proc: subprocess.Popen, at_s: float, sig: signal.Signals) -> str | None:
    """Send ``sig`` at ``at_s`` seconds after the start; None if the process ended before; a
    violation if it does not end within EXIT_S after it."""
    deadline = time.monotonic() + at_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            proc.communicate()
            return None
        time.sleep(0.01)
    if proc.poll() is not None:
        proc.communicate()
        return None
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"did not end within {EXIT_S:g} s of {sig.name} (hang)"
    if "Traceback" in err:
        frames = [line.strip() for line in err.splitlines() if line.strip().startswith("File")]
        where = frames[-1] if frames else ""
        return (f"traceback after {sig.name} at {at_s:.2f} s: {err.strip().splitlines()[-1]}"
                f" ({len(frames)} frames, last {where})")
    return ""


# -- what the storage holds --------------------------------------------------------------------
def _journal_study(path: Path, name: str) -> optuna.Study | None:
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    try:
        return optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(backend))
    except (KeyError, ValueError):
        return None


def _finished(study: optuna.Study | None) -> set[Finished]:
    if study is None:
        return set()
    return {Finished(t.number, str(t.user_attrs.get("plan", t.params)), tuple(t.values))
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


def _check_kill(before: set[Finished], now: set[Finished], exhaustive: bool) -> list[str]:
    problems = []
    lost = before - now
    if lost:
        problems.append(f"{len(lost)} finished trials lost (e.g. trial {min(lost).number})")
    plans = Counter(f.plan for f in now)
    if exhaustive and plans and plans.most_common(1)[0][1] > 1:
        problems.append(f"plan stored twice: {plans.most_common(1)[0][0]}")
    if not exhaustive and len(now) > N_TRIALS:
        problems.append(f"{len(now)} finished trials for n_trials {N_TRIALS}")
    return problems


def _check_end(study: optuna.Study | None, plans: int | None) -> list[str]:
    if study is None:
        return ["the study is missing after the final resume"]
    problems = []
    states = Counter(t.state for t in study.get_trials(deepcopy=False))
    left = states[TrialState.RUNNING] + states[TrialState.WAITING]
    if left:
        problems.append(f"{left} trials left RUNNING or WAITING")
    done = _finished(study)
    if plans is not None:
        labels = Counter(f.plan for f in done)
        if len(labels) != plans or max(labels.values(), default=0) > 1:
            problems.append(f"{len(done)} finished trials, {len(labels)} distinct plans, for"
                            f" {plans} plans")
    elif len(done) != N_TRIALS:
        problems.append(f"{len(done)} finished trials for n_trials {N_TRIALS}")
    return problems


# -- one round ---------------------------------------------------------------------------------
class Round:
    """A fresh study in a fresh storage, killed 1-3 times, then resumed to the end."""

    def __init__(self, mode: str, work: Path, rng: random.Random, slow: float, pg: str | None):
        self.mode, self.rng, self.slow = mode, rng, slow
        self.tag = uuid.uuid4().hex[:12]
        self.dir = work / f"{mode}-{self.tag}"
        self.dir.mkdir()
        site = self.dir / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SLOW)
        self.env = _env(self.tag, site, slow)
        self.exhaustive = "exhaustive" in mode or mode == "pg-workers"
        self.name = "attack"
        self.study = self.dir / "study.yaml"
        if mode == "pg-workers":
            self.study.write_text(MID.format(name=self.name))
            self.plans: int | None = 592
        else:
            sampler = "exhaustive" if self.exhaustive else "tpe"
            self.study.write_text(LAB.format(name=self.name, sampler=sampler, n_trials=N_TRIALS))
            self.plans = 56 if self.exhaustive else None
        self.storage = str(self.dir / "s.journal") if pg is None else pg
        self.jobs = ["--jobs", "2"] if mode.startswith("jobs2") else []

    def expected_s(self) -> float:
        """A run's length here, start-up included: where kill moments are drawn from."""
        n = 592 / 2 if self.mode == "pg-workers" else (self.plans or N_TRIALS)
        return 2.0 + n * self.slow / (2 if self.jobs else 1)

    def load(self) -> optuna.Study | None:
        if self.mode != "pg-workers":
            return _journal_study(Path(self.storage), self.name)
        from planner.storage import open_storage

        try:
            return optuna.load_study(study_name=self.name,
                                     storage=open_storage(self.storage, create=False))
        except KeyError:
            return None

    def launch(self, resume: bool) -> list[subprocess.Popen]:
        if self.mode == "pg-workers" and not resume:
            return [_start(["worker", str(self.study), "--storage", self.storage,
                            "--heartbeat", "1"], self.env) for _ in range(2)]
        extra = ["--resume"] if resume else []
        return [_start(["run", str(self.study), "--storage", self.storage, *self.jobs, *extra],
                       self.env)]

    def attack(self, tally: Tally, most: int) -> None:
        """Kill the round's processes 1 to 3 times (at most ``most``), then resume to the end."""
        seen: set[Finished] = set()
        kills = min(self.rng.randint(1, 3), most)
        started = False
        for _ in range(kills):
            procs = self.launch(resume=started)
            started = True
            at_s = self.rng.uniform(0.1, self.expected_s())
            sig = _signal(self.rng)
            victim = self.rng.randrange(len(procs))
            outcome = _hit(procs[victim], at_s, sig)
            for p in procs:  # the other worker is killed too (or ends by itself)
                if p.poll() is None:
                    p.kill()
                p.communicate()
            if outcome is None:
                tally.missed += 1
            else:
                tally.kills[sig.name] += 1
                if outcome:
                    self.violation(tally, outcome)
            orphans = _orphans(self.tag)
            if orphans:
                self.violation(tally, f"processes left after {sig.name}: {orphans}")
                _kill_all(self.tag)
            now = _finished(self.load())
            for problem in _check_kill(seen, now, self.exhaustive):
                self.violation(tally, f"after {sig.name}: {problem}")
            seen = now
        self.finish(tally)

    def finish(self, tally: Tally) -> None:
        proc = self.launch(resume=True)[0]
        try:
            _, err = proc.communicate(timeout=RESUME_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            self.violation(tally, f"the final resume did not end within {RESUME_S:g} s (hang)")
            return
        finally:
            _kill_all(self.tag)
        if proc.returncode != 0:
            last = (err.strip().splitlines() or [""])[-1]
            self.violation(tally, f"the final resume exited {proc.returncode}: {last}")
        for problem in _check_end(self.load(), self.plans):
            self.violation(tally, f"at the end: {problem}")

    def violation(self, tally: Tally, text: str) -> None:
        line = f"{self.mode} round {self.tag}: {text}"
        tally.violations.append(line)
        tally.kinds[_kind(text)] += 1
        print(f"VIOLATION {line}", file=sys.stderr, flush=True)


# -- PostgreSQL --------------------------------------------------------------------------------
@contextlib.contextmanager
def _pg_schema(base: str) -> Iterator[str]:
    """A schema of its own on the server, dropped afterwards (as the tests do)."""
    import sqlalchemy

    schema = f"planner_attack_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(base, connect_args={"connect_timeout": 5})
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


def _pg_url() -> tuple[str | None, str]:
    base = os.environ.get("PLANNER_TEST_POSTGRES")
    if not base:
        return None, ("PLANNER_TEST_POSTGRES is not set (export PLANNER_TEST_POSTGRES=$(bash"
                      " .ci/postgres.sh))")
    try:
        with _pg_schema(base):
            pass
    except Exception as e:  # noqa: BLE001 - any failure to connect: the mode is skipped
        return None, f"PostgreSQL does not answer: {type(e).__name__}"
    return base, ""


# -- main --------------------------------------------------------------------------------------
def _plan(kills: int, modes: list[str]) -> dict[str, int]:
    """Kills per mode, spread evenly."""
    share = {m: kills // len(modes) for m in modes}
    for m in modes[:kills % len(modes)]:
        share[m] += 1
    return share


def attack(kills: int, seed: int, slow: float, budget_s: float) -> dict[str, Tally]:
    rng = random.Random(seed)
    pg, why = _pg_url()
    modes = [m for m in MODES if m != "pg-workers" or pg]
    if not pg:
        print(f"pg-workers skipped: {why}", file=sys.stderr)
    share = _plan(kills, modes)
    tallies = {m: Tally() for m in modes}
    deadline = time.monotonic() + budget_s
    with tempfile.TemporaryDirectory(prefix="planner-attack-") as tmp:
        while time.monotonic() < deadline:
            todo = [m for m in modes if sum(tallies[m].kills.values()) < share[m]]
            if not todo:
                break
            mode = todo[rng.randrange(len(todo))]
            tally = tallies[mode]
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(_pg_schema(pg)) if mode == "pg-workers" else None
                left = share[mode] - sum(tally.kills.values())
                Round(mode, Path(tmp), rng, slow * (0.2 if url else 1), url).attack(tally, left)
            tally.rounds += 1
            done = sum(sum(t.kills.values()) for t in tallies.values())
            print(f"{done}/{kills} kills ({mode}: {dict(tally.kills)})", flush=True)
        if time.monotonic() >= deadline:
            print(f"stopped at the time budget ({budget_s:g} s)", file=sys.stderr)
    return tallies


def _table(tallies: dict[str, Tally]) -> str:
    head = (f"{'mode':<18} {'rounds':>6} {'kills':>5} {'KILL':>5} {'TERM':>5} {'INT':>5}"
            f" {'missed':>6} " + " ".join(f"{k:>9}" for k in KINDS))
    total = Tally()
    rows = [head]
    for mode, t in [*tallies.items(), ("total", total)]:
        rows.append(f"{mode:<18} {t.rounds:>6} {sum(t.kills.values()):>5}"
                    f" {t.kills['SIGKILL']:>5} {t.kills['SIGTERM']:>5} {t.kills['SIGINT']:>5}"
                    f" {t.missed:>6} " + " ".join(f"{t.kinds[k]:>9}" for k in KINDS))
        if t is not total:
            total.rounds += t.rounds
            total.kills.update(t.kills)
            total.missed += t.missed
            total.kinds.update(t.kinds)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="kills in all (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments")
    parser.add_argument("--slow-s", type=float, default=0.05,
                        help="seconds added to each estimate (default 0.05)")
    parser.add_argument("--budget-s", type=float, default=3600,
                        help="stop starting rounds after this long (default 3600)")
    parser.add_argument("--quick", action="store_true", help="20 kills")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("attack.py reads /proc: Linux only", file=sys.stderr)
        return 2
    kills = 20 if args.quick else args.kills
    start = time.monotonic()
    tallies = attack(kills, args.seed, args.slow_s, args.budget_s)
    print(_table(tallies))
    print(f"{time.monotonic() - start:.0f} s, seed {args.seed}")
    bad = [v for t in tallies.values() for v in t.violations]
    for v in bad:
        print(f"VIOLATION {v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

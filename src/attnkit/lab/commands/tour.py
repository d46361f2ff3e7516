"""``attnkit tour``: train the mechanisms on the generated tasks, several seeds, and write the report folder."""

from __future__ import annotations

import os
import shlex
import sys

from ...errors import ArgumentError, did_you_mean
from .common import add_command, positive_int

SCALES = ("default", "lra")  # the long suite's scales a user picks; --quick picks the toy one


def _selected(args, experiments: dict, default: list[str]) -> list[str]:
    """Experiment keys chosen by ``--tasks`` / ``--mechanisms`` (each filters the default set, or all if given)."""
    if not args.tasks and not args.mechanisms:
        return default
    pool = list(experiments)
    for option, attr in (("--tasks", "task"), ("--mechanisms", "mechanism")):
        wanted = getattr(args, option[2:])
        if not wanted:
            continue
        present = {getattr(e, attr) for e in experiments.values()}
        unknown = sorted(set(wanted) - present)
        if unknown:
            raise ArgumentError(f"attnkit tour: {option}: unknown {', '.join(map(repr, unknown))}; "
                                f"{did_you_mean(unknown[0], present)}known: {', '.join(sorted(present))}")
        pool = [k for k in pool if getattr(experiments[k], attr) in wanted]
    if not pool:
        raise ArgumentError(f"attnkit tour: no experiment has task in {args.tasks} and mechanism in "
                            f"{args.mechanisms}; see attnkit tour --list")
    return pool


def _print_list(experiments: dict, default: set[str], quick_default: set[str], mad: bool = False) -> None:
    width = max(len(k) for k in experiments)
    print(f"{'experiment':<{width}}  default  quick  description")
    for key, exp in experiments.items():
        print(f"{key:<{width}}  {'yes' if key in default else '-':<7}  {'yes' if key in quick_default else '-':<5}  "
              f"{getattr(exp, 'description', '')}")
    if mad:
        print(f"\n{len(experiments)} experiments, all run by attnkit tour --suite mad")
        return
    print(f"\n{len(experiments)} experiments: {len(default & experiments.keys())} run by attnkit tour, "
          f"{len(quick_default & experiments.keys())} by attnkit tour --quick; --tasks and --mechanisms pick from all")


SUITES = ("default", "long", "mad")


def _suite(args) -> str:
    if args.suite not in SUITES:
        raise ArgumentError(f"attnkit tour: --suite: unknown suite {args.suite!r}; "
                            f"{did_you_mean(args.suite, SUITES)}known: {', '.join(SUITES)}")
    return args.suite


def _long_pairs(args, the_plan) -> list[tuple[str, str]] | None:
    """The long suite's (task, mechanism) pairs chosen by ``--tasks`` / ``--mechanisms`` (None: the plan's)."""
    from ..tour.long import MECHANISMS

    if not args.tasks and not args.mechanisms:
        return None
    for option, known in (("--tasks", the_plan.tasks), ("--mechanisms", MECHANISMS)):
        unknown = sorted(set(getattr(args, option[2:]) or ()) - set(known))
        if unknown:
            raise ArgumentError(f"attnkit tour --suite long: {option}: unknown {', '.join(map(repr, unknown))}; "
                                f"{did_you_mean(unknown[0], known)}known: {', '.join(known)}")
    chosen = [(t, m) for t, m in the_plan.pairs
              if (not args.tasks or t in args.tasks) and (not args.mechanisms or m in args.mechanisms)]
    if not chosen:
        raise ArgumentError(f"attnkit tour --suite long: no run has task in {args.tasks or the_plan.tasks} and "
                            f"mechanism in {args.mechanisms} at scale {the_plan.scale!r}; see attnkit tour --suite "
                            f"long --list")
    return chosen


def _device(name: str, *, present: bool) -> None:
    """Check ``--device``: a device torch knows, and (``present``: before training) one this machine has."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ArgumentError(f"attnkit tour: --device: unknown device {name!r}; expected cpu or cuda") from err
    if device.type not in ("cpu", "cuda"):
        raise ArgumentError(f"attnkit tour: --device: the tour trains on cpu or cuda; got {name!r}")
    if present and device.type == "cuda" and not torch.cuda.is_available():
        raise ArgumentError(f"attnkit tour: --device {name}: torch sees no CUDA device on this machine")


def _long_scale(args) -> str:
    if args.scale not in SCALES:
        raise ArgumentError(f"attnkit tour: --scale: unknown scale {args.scale!r}; "
                            f"{did_you_mean(args.scale, SCALES)}known: {', '.join(SCALES)}")
    if args.quick and args.scale != "default":
        raise ArgumentError(f"attnkit tour: --quick is the toy form of the default scale; got it with --scale "
                            f"{args.scale}")
    return "quick" if args.quick else args.scale


def _print_long_list(the_plan) -> None:
    from ..tour.long.estimate import CPU_RATE, CPU_STEP, GPU_RATE, GPU_STEP, plan_seconds

    for setup in the_plan.setups:
        for mech in setup.mechanisms:
            print(f"{setup.task}/{mech}  seeds {', '.join(map(str, setup.seeds))}  {setup.budget.steps} steps of "
                  f"batch {setup.budget.batch_size}")
    runs = sum(len(s.mechanisms) * len(s.seeds) for s in the_plan.setups)
    gpu = the_plan.scale == "lra"
    seconds = plan_seconds(the_plan, rate=GPU_RATE if gpu else CPU_RATE, overhead=GPU_STEP if gpu else CPU_STEP)
    where = "one GPU" if gpu else "one CPU thread"
    print(f"\n{len(the_plan.pairs)} runs x seeds ({runs} trainings); at most about {seconds / 3600:.1f} h on {where} "
          f"(every mechanism counted at dense softmax's FLOPs; see attnkit.lab.tour.long.estimate)")


def _cmd_long(args, command: str) -> int:
    import torch

    from ..tour.long import plan, report, run_suite
    from ..tour.report.pieces import md_table

    if args.in_process:
        raise ArgumentError("attnkit tour --suite long: --in-process is not available: every run of the long suite "
                            "trains in a fresh process (its speed and memory are measured there)")
    the_plan = plan(_long_scale(args))
    if args.list:
        _print_long_list(the_plan)
        return 0
    torch.set_num_threads(args.threads or os.cpu_count() or 1)  # the budget the pairs divide (threads_per_worker)
    out = args.out or "tour-long"
    if args.readme:
        _readme(args.readme, "tour-long")  # before training: a wrong file is found now, not after the runs
    summary = run_suite(out, scale=the_plan.scale, fresh=args.fresh, progress=not args.no_progress, command=command,
                        pairs=_long_pairs(args, the_plan), seeds=args.seeds, device=args.device, workers=args.workers,
                        lr_sweep=args.lr_sweep)
    markdown, page = report.write(out)
    if args.readme:
        _splice(args.readme, "tour-long", "\n".join(md_table(report.accuracy_table(report.load(out)))))
    return _finish(summary, markdown, page, "done")


def _readme(path, name: str) -> str:
    """The text of ``path``, checked to hold the ``<!-- name:start -->`` and ``<!-- name:end -->`` lines."""
    from pathlib import Path

    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ArgumentError(f"attnkit tour: --readme: cannot read {path}: {err.strerror or err}") from err
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ArgumentError(f"attnkit tour: --readme: {path} has no {start} ... {end} lines to put the table between")
    return text


def _splice(path, name: str, table: str) -> None:
    """Put ``table`` between the ``<!-- name:start -->`` and ``<!-- name:end -->`` lines of the file ``path``."""
    from pathlib import Path

    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = _readme(path, name).split(start, 1)
    Path(path).write_text(f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def _finish(summary, markdown, page, verb: str) -> int:
    """Print what a tour call did and where its report is; exit status 1 when a run failed."""
    print(f"{len(summary.ran)} run(s) {verb}, {len(summary.cached)} reused from the cache, "
          f"{len(summary.failed)} failed, in {summary.seconds:.1f} s")
    for item in summary.failed:
        print(f"  failed: {item}")
    print(markdown)
    print(page)
    return 1 if summary.failed else 0


def _cmd_tour(args) -> int:
    import torch

    from ..tour import report, runner

    command = "attnkit " + " ".join(shlex.quote(a) for a in (args.argv if args.argv is not None else sys.argv[1:]))
    _device(args.device, present=not args.list)
    if _suite(args) == "long":
        return _cmd_long(args, command)
    if args.scale != "default":
        raise ArgumentError("attnkit tour: --scale belongs to the long suite (--suite long)")
    if args.workers is not None and args.in_process:
        raise ArgumentError("attnkit tour: --workers trains runs in processes of their own; --in-process trains "
                            "them one after another in this one")
    mad = _suite(args) == "mad"
    args.out = args.out or ("tour-mad" if mad else "tour-report")
    api = runner.api()
    experiments = api.experiments()
    if mad:
        from ..tour.experiments.mad import KEYS as MAD_KEYS
        from ..tour.experiments.mad import default_seeds
        experiments = {k: experiments[k] for k in MAD_KEYS}
    args.seeds = args.seeds or (list(default_seeds(args.device)) if mad else [0, 1, 2])
    if args.list:
        _print_list(experiments, set(api.default_set(False)), set(api.default_set(True)), mad)
        return 0
    torch.set_num_threads(args.threads or os.cpu_count() or 1)  # the budget the runs divide (threads_per_worker)
    keys = _selected(args, experiments, list(MAD_KEYS if mad else api.default_set(args.quick)))
    if args.readme:
        _readme(args.readme, "tour")
    summary = runner.tour(keys, args.seeds, quick=args.quick, out=args.out, fresh=args.fresh,
                          progress=not args.no_progress, command=command, isolate=not args.in_process,
                          device=args.device, workers=args.workers, lr_sweep=args.lr_sweep,
                          **({"scaling": False} if mad else {}))  # MAD's table has no scaling section
    markdown, page = report.write(args.out)
    if args.readme:
        _splice(args.readme, "tour", report.markdown_table(args.out))
    return _finish(summary, markdown, page, "trained")


def add(sub) -> None:
    p = add_command(sub, "tour", summary="train the mechanisms on generated tasks (3 seeds) and write a report folder",
                    description="The main job: train the mechanisms side by side on generated tasks, several seeds "
                                "each, and write a report folder (README.md and an offline index.html: accuracy "
                                "table, learning curves, attention maps of the trained models, cost and scaling "
                                "plots). Every finished run is cached in the folder, so an interrupted tour resumes. "
                                "--suite long runs the long-range suite instead: every long-sequence mechanism at "
                                "matched parameters on long generated tasks a CPU budget can teach (or, with --scale "
                                "lra, Long Range Arena's own tasks, sizes and step counts, for a GPU), the papers' "
                                "orderings decided from the seeds' spread, and the Long Range Arena picture "
                                "(accuracy against speed, memory as bubble size) in tour-long/.",
                    examples=["attnkit tour --quick", "attnkit tour --list",
                              "attnkit tour --tasks mqar --mechanisms linear performer --seeds 0",
                              "attnkit tour --suite long --quick",
                              "attnkit tour --suite long --scale lra --device cuda --list"])
    p.add_argument("--suite", default="default",
                   help="'default': the classic mechanisms on short tasks; 'long': the long-range suite (every "
                        "long-sequence mechanism on long generated tasks, report in tour-long/); 'mad': every "
                        "causal token mixer on MAD's six tasks (Poli et al. 2024), report in tour-mad/")
    p.add_argument("--scale", default="default",
                   help="the long suite's scale: 'default' (about 20 minutes on a 2-core CPU) or 'lra' (Long Range "
                        "Arena's tasks, lengths 1k-4k, model sizes and step counts: hours on one GPU)")
    p.add_argument("--quick", action="store_true", help="the short budget (a few minutes on 2 cores)")
    p.add_argument("--out", default=None, help="report folder (default: tour-report; tour-long with --suite long)")
    p.add_argument("--device", default="cpu", help="where the models train: cpu or cuda (default: cpu)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="runs trained at once, each in its own process at --threads / --workers torch threads "
                        "(at least 1: one each on 2 cores) (default: 2 on a CPU with 2 cores or more, 1 on a GPU)")
    p.add_argument("--readme", default=None,
                   help="also put the results table into this Markdown file, between its <!-- tour:start --> and "
                        "<!-- tour:end --> lines (<!-- tour-long:start/end --> for the long suite)")
    p.add_argument("--tasks", nargs="+", default=None, help="only experiments on these tasks (default: all)")
    p.add_argument("--mechanisms", nargs="+", default=None,
                   help="only experiments with these mechanisms (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="training seeds (default: 0 1 2; with --suite mad on a CPU, 0 alone)")
    p.add_argument("--fresh", action="store_true", help="ignore cached runs and run everything again")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads in all, divided among the runs trained at once (default: all cores)")
    p.add_argument("--lr-sweep", action="store_true",
                   help="train every run at 1/3, 1 and 3 times its own learning rate (three times the runs); the "
                        "report and its claims read, per experiment, the rate with the best mean accuracy over seeds, "
                        "and name it")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--in-process", action="store_true",
                   help="train every run in this process instead of a fresh one each (no process start per run; "
                        "peak memory is then not measured)")
    p.set_defaults(func=_cmd_tour, argv=None)

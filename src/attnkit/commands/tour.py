"""``attnkit tour``: train the mechanisms on the generated tasks, several seeds, and write the report folder."""

from __future__ import annotations

import os
import shlex
import sys

from ..errors import ArgumentError, did_you_mean
from .common import add_command, positive_int


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


def _print_list(experiments: dict, default: set[str], quick_default: set[str]) -> None:
    width = max(len(k) for k in experiments)
    print(f"{'experiment':<{width}}  default  quick  description")
    for key, exp in experiments.items():
        print(f"{key:<{width}}  {'yes' if key in default else '-':<7}  {'yes' if key in quick_default else '-':<5}  "
              f"{getattr(exp, 'description', '')}")
    print(f"\n{len(experiments)} experiments")


SUITES = ("default", "long")


def _suite(args) -> str:
    if args.suite not in SUITES:
        raise ArgumentError(f"attnkit tour: --suite: unknown suite {args.suite!r}; "
                            f"{did_you_mean(args.suite, SUITES)}known: {', '.join(SUITES)}")
    return args.suite


def _long_pairs(args) -> list[tuple[str, str]] | None:
    """The long suite's (task, mechanism) pairs chosen by ``--tasks`` / ``--mechanisms`` (None: the plan's)."""
    from ..tour.long import MECHANISMS, suite

    if not args.tasks and not args.mechanisms:
        return None
    for option, known in (("--tasks", suite.TASKS), ("--mechanisms", MECHANISMS)):
        unknown = sorted(set(getattr(args, option[2:]) or ()) - set(known))
        if unknown:
            raise ArgumentError(f"attnkit tour --suite long: {option}: unknown {', '.join(map(repr, unknown))}; "
                                f"{did_you_mean(unknown[0], known)}known: {', '.join(known)}")
    task_names = args.tasks or suite.plan(args.quick).tasks
    chosen = suite.pairs(task_names, args.mechanisms)
    if not chosen:
        raise ArgumentError(f"attnkit tour --suite long: no run has task in {task_names} and mechanism in "
                            f"{args.mechanisms} (lambda runs on image tasks only)")
    return list(chosen)


def _cmd_long(args, command: str) -> int:
    from ..tour.long import report, run_suite, suite

    if args.in_process:
        raise ArgumentError("attnkit tour --suite long: --in-process is not available: every run of the long suite "
                            "trains in a fresh process (its speed and memory are measured there)")
    if args.list:
        the_plan = suite.plan(args.quick)
        for task, mech in the_plan.pairs:
            print(f"{task}/{mech}")
        print(f"\n{len(the_plan.pairs)} runs x seeds {', '.join(map(str, the_plan.seeds))}")
        return 0
    out = args.out or "docs/tour-long"
    summary = run_suite(out, quick=args.quick, fresh=args.fresh, progress=not args.no_progress, command=command,
                        pairs=_long_pairs(args), seeds=args.seeds)
    return _finish(summary, *report.write(out), "done")


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
    if _suite(args) == "long":
        return _cmd_long(args, command)
    args.out = args.out or "tour-report"
    args.seeds = args.seeds or [0, 1, 2]
    api = runner.api()
    experiments = api.experiments()
    if args.list:
        _print_list(experiments, set(api.default_set(False)), set(api.default_set(True)))
        return 0
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    keys = _selected(args, experiments, list(api.default_set(args.quick)))
    summary = runner.tour(keys, args.seeds, quick=args.quick, out=args.out, fresh=args.fresh,
                          progress=not args.no_progress, command=command, isolate=not args.in_process)
    return _finish(summary, *report.write(args.out), "trained")


def add(sub) -> None:
    p = add_command(sub, "tour", summary="train the mechanisms on generated tasks (3 seeds) and write a report folder",
                    description="The main job: train the mechanisms side by side on generated tasks, several seeds "
                                "each, and write a report folder (README.md and an offline index.html: accuracy "
                                "table, learning curves, attention maps of the trained models, cost and scaling "
                                "plots). Every finished run is cached in the folder, so an interrupted tour resumes. "
                                "--suite long runs the long-range suite instead: every long-sequence mechanism at "
                                "matched parameters on five LRA-style tasks, and the Long Range Arena picture "
                                "(accuracy against speed, memory as bubble size) in docs/tour-long.",
                    examples=["attnkit tour --quick", "attnkit tour --list",
                              "attnkit tour --tasks mqar --mechanisms linear performer --seeds 0",
                              "attnkit tour --suite long --quick"])
    p.add_argument("--suite", default="default",
                   help="'default': the classic mechanisms on short tasks; 'long': the long-range suite (every "
                        "long-sequence mechanism on five LRA-style tasks, report in docs/tour-long)")
    p.add_argument("--quick", action="store_true", help="the short budget (about 2 minutes on 2 cores)")
    p.add_argument("--out", default=None, help="report folder (default: tour-report; docs/tour-long with --suite long)")
    p.add_argument("--tasks", nargs="+", default=None, help="only experiments on these tasks (default: all)")
    p.add_argument("--mechanisms", nargs="+", default=None,
                   help="only experiments with these mechanisms (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="training seeds (default: 0 1 2)")
    p.add_argument("--fresh", action="store_true", help="ignore cached runs and run everything again")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--in-process", action="store_true",
                   help="train every run in this process instead of a fresh one each (no process start per run; "
                        "peak memory is then not measured)")
    p.set_defaults(func=_cmd_tour, argv=None)

"""The CUDA backend on this machine's GPU: a short search per CUDA problem, in-process (no Temporal, no database).

    python bench/cuda.py [--json] [--json-out PATH] [--problems softmax,rmsnorm] [--minutes 5]
                         [--per-generation 12] [--landscape]

For every built-in problem with a CUDA kernel (or those named): compile, validate and keep the seed kernel;
then, until the problem's share of ``--minutes`` is mostly spent, generations of template settings drawn at
random (seeded) from the problem's CUDA_TEMPLATE_PARAMS, compiled with NVRTC and validated on the GPU side by
side, then timed together against the incumbent in one interleaved benchmark; the fastest whose whole
interval is above 1 + PROMOTION_MARGIN becomes the incumbent (:func:`search`). Finally the incumbent is
timed against the seed and the library baseline (CuPy) with a longer budget:

- speedup_vs_seed, speedup_vs_library: ratio and interval (library: or why it was skipped), by problem;
- hbm_fraction: the incumbent's fraction of the HBM roofline (bytes moved / measured bandwidth), by problem;
- the GPU's fingerprint and measured HBM bandwidth.

With ``--landscape`` it measures each problem's whole template space instead of searching it: every allowed
setting compiled and validated (side by side: validations share the GPU), then the seed timed against every
correct setting in ONE interleaved benchmark (one input upload, the same rounds for all), so each setting's
time is a ratio to the seed's measured in the same run. Keys: ``best_in_space_hbm_fraction`` and
``best_in_space`` (the setting) by problem, and each setting's ``hbm_fraction`` (weighed over the shapes as
the judge weighs the candidate's) and ``hbm_fraction_by_shape``. It says whether the space holds a
near-roofline kernel at all.

Every figure is printed with the command that reproduces it. Without a GPU it prints why it skipped (with
``--json``: ``{"skipped": "..."}``) and exits 0. Progress goes to stderr; the figures (or the JSON) to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on the import path, and this file is then the module
# `cuda`, hiding cuda-python's package (here and in every child that inherits the path): drop the folder.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from engine.targets import scan_gpus  # noqa: E402 - after the path set-up

# A template instance replaces the incumbent when its whole interval clears this margin.
PROMOTION_MARGIN = 0.02
# The search's share of a problem's time; the rest is the final benchmark and slack.
SEARCH_SHARE = 0.7


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def template_sample(problem: Any, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Up to ``count`` distinct template settings the problem allows, in a random (seeded) order."""
    allowed = allowed_settings(problem)
    rng.shuffle(allowed)
    return allowed[:count]


def allowed_settings(problem: Any) -> list[dict[str, Any]]:
    """Every template setting the problem allows, in the order its knobs' values are declared."""
    space = problem.template_params
    if not space:
        return []
    settings = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    return [s for s, ok in zip(settings, problem.allowed(settings), strict=True) if ok]


def figure(report: Any) -> dict[str, Any]:
    """A benchmark report as a figure: ratio and interval, or why there is none."""
    if str(report.verdict) != "ok":
        return {"skipped": report.message, "verdict": str(report.verdict)}
    return {
        "ratio": report.speedup,
        "ci_low": report.ci_low,
        "ci_high": report.ci_high,
        "confidence": report.confidence,
    }


def compiled_and_validated(backend: Any, problem: Any, source: str, seed: int) -> tuple[str | None, str, bool]:
    """``source`` compiled and validated on the GPU: its artifact id (None unless both are ok), "ok" or what
    failed, and whether it compiled. A harness failure is said, not raised: one setting's must not end a run."""
    try:
        compiled = backend.compile(problem, source)
        if str(compiled.verdict) != "ok" or not compiled.artifact_id:
            return None, f"compile {compiled.verdict}: {compiled.first_error}", False
        validated = backend.validate(problem, compiled.artifact_id, seed=seed)
    except Exception as error:
        return None, f"harness: {type(error).__name__}: {error}", False
    if str(validated.verdict) != "ok":
        return None, f"validation {validated.verdict}: {validated.message}", True
    return str(compiled.artifact_id), "ok", True


def search(backend: Any, name: str, seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    """One problem's short search and final benchmark; the figures and what the search did.

    Generation by generation: ``--per-generation`` settings not tried yet (a seeded random order) are compiled
    and validated side by side, then the incumbent is timed against every correct one in ONE interleaved
    benchmark (one upload of the input sets, the same rounds for all: a benchmark costs seconds of set-up on
    the host, so one per setting left a 30 s search two or three settings). A setting replaces the incumbent
    when its whole interval clears 1 + PROMOTION_MARGIN; the fastest such one of the generation does."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Lock

    from engine.harness.benchmarking import Reference
    from engine.problems import load_problem

    started = time.monotonic()
    problem = backend.problem(load_problem(name))
    record: dict[str, Any] = {"problem": name, "tried": 0, "compiled": 0, "correct": 0, "promoted": []}
    counting = Lock()

    def count(key: str) -> None:
        with counting:
            record[key] += 1

    def build(source: str, label: str) -> str | None:
        artifact, why, compiled = compiled_and_validated(backend, problem, source, args.seed)
        if compiled:
            count("compiled")
        if artifact is None:
            say(f"  [{name}] {label}: {why}")
            return None
        count("correct")
        return artifact

    seed_id = build(problem.seed_source(), "seed")
    if seed_id is None:
        record["error"] = "the seed kernel did not compile or validate (see the lines above)"
        return record
    incumbent, incumbent_label = seed_id, "seed"
    untried = template_sample(problem, args.candidates, random.Random(args.seed))
    record["generations"] = 0
    while untried and time.monotonic() - started < SEARCH_SHARE * seconds:
        generation, untried = untried[: args.per_generation], untried[args.per_generation :]
        record["generations"] += 1
        record["tried"] += len(generation)
        with ThreadPoolExecutor(args.workers) as pool:
            built = list(
                pool.map(lambda params: build(problem.render_template(params), setting_label(params)), generation)
            )
        correct = [(params, artifact) for params, artifact in zip(generation, built, strict=True) if artifact]
        if not correct:
            continue
        reports = backend.benchmark(
            problem,
            incumbent,
            [
                Reference(kind="artifact", artifact_id=artifact, label=setting_label(params))
                for params, artifact in correct
            ],
            budget_s=args.budget,
            # One seed for every benchmark of the problem: the judge keeps the (large) input sets it drew.
            seed=args.seed,
        )
        best: tuple[dict[str, Any], str, float, float] | None = None
        for (params, artifact), report in zip(correct, reports, strict=True):
            if str(report.verdict) != "ok":
                say(f"  [{name}] {setting_label(params)}: not timed ({report.verdict}: {report.message})")
                continue
            # The report is the incumbent's speedup over the setting: the setting's over the incumbent is 1 / it.
            speedup, low, high = 1 / report.speedup, 1 / report.ci_high, 1 / report.ci_low
            say(f"  [{name}] {setting_label(params)}: {speedup:.3f}x vs incumbent [{low:.3f}, {high:.3f}]")
            if low > 1 + PROMOTION_MARGIN and (best is None or speedup > best[2]):
                best = (params, artifact, speedup, low)
        if best is not None:
            params, incumbent, speedup, low = best
            incumbent_label = setting_label(params)
            record["promoted"].append({"params": params, "ratio": speedup, "ci_low": low})
    references = [Reference(kind="artifact", artifact_id=seed_id, label="seed"), backend.library_reference]
    versus_seed, versus_library = backend.benchmark(
        problem, incumbent, references, budget_s=args.final_budget, seed=args.seed
    )
    record |= {
        "best": incumbent_label,
        "speedup_vs_seed": figure(versus_seed),
        "speedup_vs_library": figure(versus_library),
        "hbm_fraction": versus_seed.roofline_fraction,
        "gpu": versus_seed.hardware.gpu.model_dump(mode="json") if versus_seed.hardware.gpu else None,
        "seconds": time.monotonic() - started,
    }
    if str(versus_seed.verdict) != "ok":
        record["error"] = f"final benchmark: {versus_seed.verdict}: {versus_seed.message}"
    return record


def landscape(backend: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every allowed template setting of one problem: compiled and validated side by side, then timed against the
    seed (and the library baseline) in one interleaved benchmark; each setting's ratio and HBM fraction."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.harness.benchmarking import Reference
    from engine.harness.cuda.child import shape_key
    from engine.harness.stats import weighted_geomean
    from engine.problems import load_problem

    started = time.monotonic()
    problem = backend.problem(load_problem(name))
    settings = allowed_settings(problem)

    def build(source: str) -> tuple[str | None, str]:
        artifact, why, _ = compiled_and_validated(backend, problem, source, args.seed)
        return artifact, why

    seed_id, why = build(problem.seed_source())
    if seed_id is None:
        return {"problem": name, "error": f"the seed kernel: {why}"}
    # Validations take the GPU's lock shared, so they run side by side; compiles are NVRTC children.
    with ThreadPoolExecutor(args.workers) as pool:
        built = list(pool.map(lambda params: build(problem.render_template(params)), settings))
    record: dict[str, Any] = {"problem": name, "settings": [], "build_seconds": time.monotonic() - started}
    correct = [(params, artifact) for params, (artifact, _) in zip(settings, built, strict=True) if artifact]
    for params, (artifact, why) in zip(settings, built, strict=True):
        if artifact is None:
            record["settings"].append({"params": params, "verdict": why})
            say(f"  [{name}] {params}: {why}")
    say(f"[{name}] {len(correct)} of {len(settings)} settings correct in {record['build_seconds']:.0f}s; timing")
    references = [
        *(
            Reference(kind="artifact", artifact_id=artifact, label=setting_label(params))
            for params, artifact in correct
        ),
        backend.library_reference,
    ]
    reports = backend.benchmark(problem, seed_id, references, budget_s=args.final_budget, seed=args.seed)
    seed_fraction = reports[0].roofline_fraction
    if str(reports[0].verdict) != "ok" or seed_fraction is None:
        record["error"] = f"the landscape benchmark: {reports[0].verdict}: {reports[0].message}"
        return record
    rows: list[dict[str, Any]] = []
    for (params, _), report in zip(correct, reports, strict=False):
        # The setting's median time per shape is the report's reference time: its fraction of the roofline is
        # weighed over the shapes as the judge weighs the candidate's.
        row: dict[str, Any] = {"params": params, "verdict": "ok", "seed_vs_setting": figure(report)}
        row["hbm_fraction"], row["hbm_fraction_by_shape"] = None, {}
        if str(report.verdict) == "ok" and all(t.roofline_ns for t in report.shapes):
            by_shape = [t.roofline_ns / t.reference_ns for t in report.shapes]
            row["hbm_fraction"] = weighted_geomean(by_shape, [t.weight for t in report.shapes])
            row["hbm_fraction_by_shape"] = {shape_key(t.shape): f for t, f in zip(report.shapes, by_shape, strict=True)}
        rows.append(row)
    record["settings"].extend(rows)
    ranked = sorted((r for r in rows if r["hbm_fraction"] is not None), key=lambda r: -r["hbm_fraction"])
    record |= {
        "seed_hbm_fraction": seed_fraction,
        "seed_hbm_fraction_by_shape": {
            shape_key(t.shape): t.roofline_ns / t.candidate_ns for t in reports[0].shapes if t.roofline_ns
        },
        "seed_vs_library": figure(reports[-1]),
        "best_in_space": ranked[0]["params"] if ranked else None,
        "best_in_space_hbm_fraction": ranked[0]["hbm_fraction"] if ranked else None,
        "gpu": reports[0].hardware.gpu.model_dump(mode="json") if reports[0].hardware.gpu else None,
        "seconds": time.monotonic() - started,
    }
    for r in ranked[:5]:
        say(f"  [{name}] {setting_label(r['params'])}: {r['hbm_fraction']:.3f} of the HBM roofline")
    return record


def setting_label(params: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in params.items())


def reproduce(argv: list[str], problem: str) -> str:
    """The command that makes one problem's figures again: these arguments, for that problem alone."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--problems", "--json-out"):
            skip = True
        elif not arg.startswith(("--problems=", "--json-out=")) and arg != "--json":
            kept.append(arg)
    return shlex.join([Path(sys.executable).name, "bench/cuda.py", *kept, "--problems", problem])


def text_of(value: dict[str, Any] | None) -> str:
    if not value:
        return "n/a"
    if "skipped" in value:
        return f"skipped ({value['verdict']}: {value['skipped']})"
    return f"{value['ratio']:.3f}x [{value['ci_low']:.3f}, {value['ci_high']:.3f}] at {value['confidence']:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--json-out", default=None, metavar="PATH", help="also write the JSON document to PATH")
    parser.add_argument("--problems", default="", help="comma-separated CUDA problems (default: every one)")
    parser.add_argument("--minutes", type=float, default=5.0, help="wall time over all problems (default 5)")
    parser.add_argument("--candidates", type=int, default=48, help="template settings per problem at most")
    parser.add_argument("--per-generation", type=int, default=12, help="settings timed together against the incumbent")
    parser.add_argument("--budget", type=float, default=0.5, help="timing budget per candidate, seconds")
    parser.add_argument("--final-budget", type=float, default=2.0, help="timing budget of the final benchmark")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler and of the inputs")
    parser.add_argument(
        "--landscape", action="store_true", help="measure every allowed template setting instead of searching"
    )
    parser.add_argument("--workers", type=int, default=8, help="compiles and validations side by side")
    args = parser.parse_args(argv)
    from engine.problems import builtin_problems

    cuda_problems = builtin_problems("cuda")
    named = [n.strip() for n in args.problems.split(",") if n.strip()]
    unknown = [n for n in named if n not in cuda_problems]
    if unknown:
        # Said before the GPU is looked for: a typo on a machine without one would otherwise read as a skip.
        parser.error(f"--problems: no CUDA problem named {', '.join(map(repr, unknown))}; choose from {cuda_problems}")
    given = list(argv if argv is not None else sys.argv[1:])
    command = shlex.join([Path(sys.executable).name, "bench/cuda.py", *given])

    scan = scan_gpus()
    if not scan.gpus:
        reason = f"no GPU: {scan.reason}"
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"skipped": reason}))
        print(json.dumps({"skipped": reason}) if args.json else f"bench/cuda.py skipped: {reason}")
        return 0

    from engine.harness.backend import backend_for

    gpu = scan.gpus[0]
    backend = backend_for(gpu.target)
    names = named or cuda_problems
    say(f"{command}: {gpu.name} ({gpu.target}), problems {names}, {args.minutes:g} min")
    share = 60 * args.minutes / max(1, len(names))
    records = []
    for name in names:
        say(f"[{name}] searching for {share:.0f}s")
        try:
            records.append(landscape(backend, name, args) if args.landscape else search(backend, name, share, args))
        except Exception as error:  # one problem's failure must not hide the others' figures
            records.append({"problem": name, "error": f"{type(error).__name__}: {error}"})
            say(f"[{name}] failed: {type(error).__name__}: {error}")
    fingerprint = next((r["gpu"] for r in records if r.get("gpu")), None)
    bandwidth = fingerprint.get("hbm_bandwidth_gbs") if fingerprint else None
    landscape_keys = (
        {
            "best_in_space_hbm_fraction": {r["problem"]: r.get("best_in_space_hbm_fraction") for r in records},
            "best_in_space": {r["problem"]: r.get("best_in_space") for r in records},
        }
        if args.landscape
        else {}
    )
    document = {
        "command": command,
        **landscape_keys,
        "gpu": fingerprint,
        "hbm_bandwidth_gbs": bandwidth,
        "hbm_fraction": {r["problem"]: r.get("hbm_fraction") for r in records},
        "speedup_vs_seed": {r["problem"]: r.get("speedup_vs_seed") for r in records},
        "speedup_vs_library": {r["problem"]: r.get("speedup_vs_library") for r in records},
        "problems": records,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(document, indent=1, default=str))
    if args.json:
        print(json.dumps(document, indent=1, default=str))
    else:
        print(f"GPU: {json.dumps(fingerprint)}  <- {command}")
        print(f"hbm_bandwidth_gbs: {bandwidth}  <- {command}")
        for r in records:
            again = reproduce(given, r["problem"])
            if "error" in r:
                print(f"[{r['problem']}] ERROR: {r['error']}  <- {again}")
            if "speedup_vs_seed" in r:
                print(f"[{r['problem']}] best: {r['best']}  <- {again}")
                print(f"[{r['problem']}] speedup_vs_seed: {text_of(r['speedup_vs_seed'])}  <- {again}")
                print(f"[{r['problem']}] speedup_vs_library: {text_of(r['speedup_vs_library'])}  <- {again}")
                fraction = r["hbm_fraction"]
                print(f"[{r['problem']}] hbm_fraction: {fraction:.3f}  <- {again}" if fraction is not None else "")
            if r.get("best_in_space_hbm_fraction") is not None:
                best = setting_label(r["best_in_space"])
                print(f"[{r['problem']}] seed_hbm_fraction: {r['seed_hbm_fraction']:.3f}  <- {again}")
                print(f"[{r['problem']}] seed_vs_library: {text_of(r['seed_vs_library'])}  <- {again}")
                print(
                    f"[{r['problem']}] best_in_space_hbm_fraction: {r['best_in_space_hbm_fraction']:.3f} "
                    f"({best})  <- {again}"
                )
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())

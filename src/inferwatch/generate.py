"""`inferwatch generate`: write every generated file (rules, dashboards, Prometheus and Alertmanager
config) from one spec, or with `--check` fail when the committed files differ from what the spec generates.

Each area contributes a generator: a function `outputs(spec) -> {relative path: file text}` listed in
GENERATORS. Paths are relative to the output root (the current directory by default): every file is written
under `--out DIR`, nowhere else.

The spec reference page (docs/spec-reference.md) documents inferwatch's fields, not one spec's values: it is
written only when the output root is the inferwatch checkout that is running (its own docs); generating for
one's own stack elsewhere leaves it out (`--spec-reference` writes it anyway).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from pathlib import Path

from inferwatch import safewrite
from inferwatch.errors import UsageError
from inferwatch.spec import DEFAULT_SPEC_PATH, Spec, load_spec
from inferwatch.specload import SpecError

log = logging.getLogger(__name__)

# "module:function" entries; each returns {relative path: text}. Order only matters for the log.
GENERATORS: list[str] = [
    "inferwatch.rules.generate:outputs",  # rules/generated/*.yml, PrometheusRule, deploy/prometheus/prometheus.yml
    "inferwatch.deploy.alertmanager:outputs",  # deploy/alertmanager/alertmanager.yml
    "inferwatch.dashboards.generate:outputs",  # dashboards/generated/*.json (Grafana 11+)
    "inferwatch.deploy.compose:outputs",  # deploy/compose/{prometheus,alertmanager}.yml for docker-compose.yml
    "inferwatch.deploy.kubernetes.generate:outputs",  # deploy/kubernetes/ kustomize base (prometheusrule.yaml: rules)
    "inferwatch.deploy.central:outputs",  # deploy/central/ edge and vmalert configuration (spec central_store)
    "inferwatch.deploy.kubernetes.clusters:generated",  # Prometheus CR patch (cluster), vmalert on Kubernetes (central)
    "inferwatch.specdoc:outputs",  # docs/spec-reference.md: every spec field, its type, default and meaning
    "inferwatch.deploy.gates.generate:outputs",  # deploy/kubernetes/gates/: Argo, Flagger and KEDA objects (component)
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="write rules, dashboards, Prometheus and Alertmanager config from the spec",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="spec file (default ./inferwatch.yaml; required when that does not exist)")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="output root: every file is written under it (default: current directory)")
    p.add_argument("--spec-reference", action="store_true",
                   help="also write docs/spec-reference.md (the page of every spec field), which is otherwise "
                        "written only into the inferwatch checkout that is running")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 listing every file that is missing or differs")
    p.set_defaults(func=run)


def render_all(spec: Spec) -> dict[str, str]:
    """Every generated file for `spec`: {relative path: text}. Raises SpecError on a spec no generator accepts."""
    files: dict[str, str] = {}
    for entry in GENERATORS:
        module, func = entry.split(":")
        produced = getattr(importlib.import_module(module), func)(spec)
        clash = files.keys() & produced.keys()
        if clash:
            raise RuntimeError(f"generators disagree on who writes {sorted(clash)}")
        files.update(produced)
    return files


def project_checkout(root: Path) -> bool:
    """True when `root` is the source checkout of the running inferwatch (the package's directory lies under it,
    as `inferwatch/` or `src/inferwatch/`, and not inside an installed environment's site-packages)."""
    package = Path(__file__).resolve().parent
    if "site-packages" in package.parts or "dist-packages" in package.parts:
        return False
    return package.parent == root.resolve() or package.parent == root.resolve() / "src"


def for_root(files: dict[str, str], root: Path, spec_reference: bool = False) -> dict[str, str]:
    """`files` as written under `root`: without the spec reference page unless `root` is the running
    inferwatch's checkout or `spec_reference` asks for it (a user's stack has no use for inferwatch's docs)."""
    from inferwatch.specdoc import PATH

    if spec_reference or project_checkout(root):
        return files
    return {rel: text for rel, text in files.items() if rel != PATH}


def stale_files(files: dict[str, str], root: Path) -> list[str]:
    """Relative paths whose file under `root` is missing or differs from `files`."""
    stale = []
    for rel, text in sorted(files.items()):
        path = root / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
    return stale


def run(args: argparse.Namespace) -> int:
    if args.spec is None and not Path(DEFAULT_SPEC_PATH).exists():
        # Generating from built-in defaults into an arbitrary directory is never what was meant.
        raise UsageError(f"no spec file: no ./{DEFAULT_SPEC_PATH} here; pass --spec or run from the repository root")
    file = args.spec or DEFAULT_SPEC_PATH
    spec = load_spec(file)
    root = Path(args.out)
    try:
        files = for_root(render_all(spec), root, getattr(args, "spec_reference", False))
    except SpecError as exc:
        raise exc.with_file(file) from None
    from inferwatch.speccheck import replica_findings

    for finding in replica_findings(spec):  # generated outputs that run replicas without a shared outbox
        print(f"warning: {finding}", file=sys.stderr)
    if args.check:
        stale = stale_files(files, root)
        for rel in stale:
            path = root / rel
            print(f"stale: {rel}" if path.exists() else f"missing: {rel}", file=sys.stderr)
            if path.exists():
                diff = difflib.unified_diff(path.read_text(encoding="utf-8").splitlines(), files[rel].splitlines(),
                                            f"committed/{rel}", f"generated/{rel}", lineterm="", n=1)
                for line in list(diff)[:20]:
                    print("  " + line, file=sys.stderr)
        if stale:
            again = "".join(f" {flag} {value}" for flag, value in (("--spec", args.spec), ("--out", args.out))
                            if value and value != ".")
            again += " --spec-reference" if getattr(args, "spec_reference", False) else ""
            print(f"{len(stale)} of {len(files)} generated file(s) are stale: run `inferwatch generate{again}`",
                  file=sys.stderr)
            return 1
        print(f"all {len(files)} generated file(s) are up to date")
        return 0
    stale = stale_files(files, root)
    safewrite.check_all(root, stale)  # refuse before writing anything (symbolic links leaving --out)
    for rel in stale:
        safewrite.write(root, rel, files[rel])
        log.info("wrote %s", rel)
    print(f"generated {len(files)} file(s) under {root.resolve()}")
    return 0

"""deploy = convert + verify + bench + ship; ``ship`` checks a bundle's gates and installs it in a device store.

The stores themselves (layout, locking, crash-safe switching, local and ssh) live in ``edge.store``;
their names are re-exported here for the modules and scripts that import them from ``edge.deploy``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edge.bundle import Bundle
from edge.store import (BUNDLES, CURRENT, HISTORY, PREVIOUS, SSH_OPTIONS_ENV, DeviceStore, SshStore, Store,  # noqa: F401
                        _symlink_atomic, open_store, rollback)

log = logging.getLogger("edge.deploy")


@dataclass
class DeployResult:
    bundle: Bundle
    shipped_to: str
    benchmark: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    #: why parity was not run on this host (the manifest's skipped reason): the bundle ships unverified
    unverified: str | None = None
    #: whether the benchmark's budget verdict gated the deploy (same device class as the target's) and why;
    #: None when there was no benchmark
    budget_gates: bool | None = None
    device_class: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle.id, "bundle_path": str(self.bundle.path), "shipped_to": self.shipped_to,
                "parity": self.bundle.manifest.get("parity"), "unverified": self.unverified,
                "benchmark": self.benchmark, "budget_gates": self.budget_gates, "device_class": self.device_class,
                "notes": self.notes}


def ship(bundle: Bundle | str | os.PathLike[str], device: str | os.PathLike[str], *,
         accept_parity_failure: bool = False, accept_budget_failure: bool = False, trust: Any = None) -> str:
    """Verify ``bundle`` and install it as the device's current bundle. Refuses failed gates and, where a
    trust store applies (``trust``, else ``$EDGEKIT_TRUST_DIR``, else a local store's ``trust/``), what it
    does not vouch for: checked here before anything is copied or sent, and again by a local store on the
    copy that landed (the device side)."""
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, trust=False)
    b.verify()
    from edge.manifest import check_gates  # parity and budget recomputed from the figures, not read from flags

    with open_store(device, trust=trust) as store:
        if store.trust is None:
            from edge.trust import no_trust_note

            log.info(no_trust_note(f"device store {store.where}"))
        else:  # the evidence the gates read is then the signed evidence
            store.trust.check(b)
        check_gates(b.info, accept_parity_failure=accept_parity_failure, accept_budget_failure=accept_budget_failure)
        where = store.install(b)
    return str(where)


def deploy(model: str | os.PathLike[str], target: str, device: str | os.PathLike[str], *,
           build_dir: str | os.PathLike[str] | None = None, bench_iterations: int = 200,
           fps: float | None = None, budget_ms: float | None = None,
           accept_parity_failure: bool = False, accept_budget_failure: bool = False, allow_cpu_fallback: bool = False,
           on_step: Callable[[str], None] | None = None, sign_key: str | None = None, trust: Any = None,
           tuned: Any = None, **convert_kwargs: Any) -> DeployResult:
    """Convert + parity + benchmark (on this host when the target runtime runs here) + sign (with
    ``sign_key``, else ``$EDGEKIT_SIGN_KEY``, when either names a key) + ship.

    The benchmark's budget verdict gates only when this host is the target's device class
    (``edge.targets.same_device_class``: its OS, CPU architecture and platform, and the runner on the
    target's accelerator); otherwise it is recorded as indicative, with the reason. A bundle whose
    parity could not run here ships with ``DeployResult.unverified`` saying why. ``tuned``: an ``edgekit tune``
    overlay (file or ``edge.tuned.TunedOverlay``) applied to the target before converting and benchmarking."""
    from edge.signing import configured_sign_key
    from edge.bench import judge_device_class, run_benchmark
    from edge.manifest_schema import SkippedParity
    from edge.pipeline import convert, runnable_here
    from edge.stats import budget_from
    from edge.targets import get_target

    say = on_step or (lambda _m: None)
    profile = get_target(target, convert_kwargs.get("targets_dir", ()))
    applied: list[str] = []
    if tuned is not None:  # applied here, so the benchmark below runs the tuned runner and options too
        from edge.tuned import apply_tuned

        profile, convert_kwargs["precision"] = apply_tuned(profile, tuned, convert_kwargs.get("precision"),
                                                           applied.append)
        say(applied[-1])
    open_store(device)  # a bad address, bad ssh options or no ssh fail here: before minutes of work, nothing built
    build = Path(build_dir) if build_dir else Path("build") / f"{Path(model).stem}-{target}"
    bundle = convert(model, profile, build, accept_parity_failure=accept_parity_failure, on_step=say, force=True,
                     **convert_kwargs)
    notes: list[str] = list(applied)  # what a tuned overlay applied, first
    report = None
    gates = device_class = None
    par = bundle.info.parity
    unverified = par.skipped if isinstance(par, SkippedParity) else None
    if unverified is not None:
        say(f"unverified on this host: {unverified}")
    run_here = runnable_here(profile)  # parity may have run on a host proxy; the benchmark needs the runner itself
    if run_here is not None:
        notes.append(f"not benchmarked: the target's runner cannot run on this host ({run_here}); run "
                     f"`edgekit bench {bundle.path} --record` on the device")
    else:
        budget, source = budget_from(fps, budget_ms, profile.frame_budget_ms)
        say(f"benchmarking {bench_iterations} iterations on this host")
        extra = {"allow_cpu_fallback": True} if allow_cpu_fallback else {}
        from edge.bench import bundle_feeds

        feeds, feeds_from = bundle_feeds(bundle)  # the reference pairs' input, as `edgekit bench` feeds
        rep = run_benchmark(lambda: bundle.open_runner(extra), iterations=bench_iterations, budget_ms=budget, budget_source=source,
                            bundle=bundle.id, target=profile.name, feeds=feeds, feeds_from=feeds_from)
        gates, device_class = judge_device_class(rep, profile)
        if gates:
            notes.append(f"the budget verdict gates this deploy: {device_class}")
        else:
            notes.append(f"the budget verdict is indicative and does not gate this deploy: {device_class}")
        say(notes[-1])
        report = rep.to_json()
        bundle.record("benchmark", report)
    key = configured_sign_key(sign_key)
    if key is not None:  # last: the signature covers the final manifest, benchmark included
        from edge.signing import sign_bundle

        say(f"signing {bundle.id} with {key}")
        signed = sign_bundle(bundle.path, key)
        notes.append(f"signed with key {signed.key_id}: {signed.name} version {signed.version}")
        bundle = Bundle.open(bundle.path, trust=False)
    say(f"shipping {bundle.id} to {device}")
    where = ship(bundle, device, accept_parity_failure=accept_parity_failure, accept_budget_failure=accept_budget_failure,
                 trust=trust)
    return DeployResult(bundle, where, report, notes, unverified=unverified, budget_gates=gates,
                        device_class=device_class)

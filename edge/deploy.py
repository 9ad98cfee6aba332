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

    def to_json(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle.id, "bundle_path": str(self.bundle.path), "shipped_to": self.shipped_to,
                "parity": self.bundle.manifest.get("parity"), "benchmark": self.benchmark, "notes": self.notes}


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
           **convert_kwargs: Any) -> DeployResult:
    """Convert + parity + benchmark (on this host when the target runtime runs here) + sign (with
    ``sign_key``, else ``$EDGEKIT_SIGN_KEY``, when either names a key) + ship."""
    from edge.signing import configured_sign_key
    from edge.bench import run_benchmark
    from edge.convert import convert
    from edge.stats import budget_from
    from edge.targets import get_target

    say = on_step or (lambda _m: None)
    profile = get_target(target, convert_kwargs.get("targets_dir", ()))
    open_store(device)  # a bad address, bad ssh options or no ssh fail here: before minutes of work, nothing built
    build = Path(build_dir) if build_dir else Path("build") / f"{Path(model).stem}-{target}"
    bundle = convert(model, profile, build, accept_parity_failure=accept_parity_failure, on_step=say, force=True,
                     **convert_kwargs)
    notes: list[str] = []
    report = None
    if bundle.manifest["parity"].get("skipped"):
        notes.append(f"benchmark skipped: {bundle.manifest['parity']['skipped']}")
    else:
        budget, source = budget_from(fps, budget_ms, profile.frame_budget_ms)
        say(f"benchmarking {bench_iterations} iterations on this host")
        extra = {"allow_cpu_fallback": True} if allow_cpu_fallback else {}
        rep = run_benchmark(lambda: bundle.open_runner(extra), iterations=bench_iterations, budget_ms=budget, budget_source=source,
                            bundle=bundle.id, target=profile.name)
        rep.on_target_device = rep.runner.get("fallback") is None
        if not rep.on_target_device:
            notes.append(f"benchmark ran on this host's fallback device ({rep.runner['fallback']}); "
                         "its budget verdict is indicative and does not gate the deploy")
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
    return DeployResult(bundle, where, report, notes)

"""Every ``EDGEKIT_*`` environment variable edgekit reads, declared once.

The reference page (``docs/environment.md``) is generated from :data:`ENVIRONMENT` when the docs are built, and
``tests/test_envvars.py`` fails when code reads a variable this registry does not list (or the registry lists one
nothing reads), so the page cannot drift from the code. Data only: no imports of the modules that read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    group: str
    meaning: str
    default: str
    read_by: str  # the module that reads it


ENVIRONMENT: tuple[EnvVar, ...] = (
    # -- build host: targets, toolchains, conversion ------------------------------------------------
    EnvVar(
        "EDGEKIT_TARGETS_PATH",
        "Build host",
        "Extra directories of target profiles (`os.pathsep`-separated), searched after `--targets-dir` and before "
        "the profiles shipped in the wheel.",
        "unset: the shipped profiles only",
        "edge.targets",
    ),
    EnvVar(
        "EDGEKIT_TOOLCHAINS",
        "Build host",
        "Where `edgekit toolchain install` puts the heavy converter environments (`<dir>/<name>`).",
        "`$XDG_CACHE_HOME/edgekit/toolchains`, else `~/.cache/edgekit/toolchains`",
        "edge.toolchains.state",
    ),
    EnvVar(
        "EDGEKIT_PARITY_TIMEOUT_S",
        "Build host",
        "The most seconds an ONNX source may run as parity's reference, over all its samples; past it the "
        "conversion stops in one line (a `Loop` whose trip count never ends).",
        "300",
        "edge.verify.parity",
    ),
    EnvVar(
        "EDGEKIT_ISA_TIMEOUT_S",
        "Build host",
        "The most seconds the emulated aarch64 check (`verify --isa`, and `convert`/`deploy` for aarch64 devices) "
        "may run. Once a sample is measured the run is bounded by start-up + 2 x the seconds per sample x the "
        "samples + 60 s, never over this; past it the check stops in one line.",
        "1800",
        "edge.verify.isa",
    ),
    EnvVar(
        "EDGEKIT_DEBIAN_MIRROR",
        "Build host",
        "The Debian mirror `edgekit toolchain install aarch64` lays the arm64 root out from.",
        "the first `http(s)://.../debian` the host's apt sources name",
        "edge.toolchains.aarch64",
    ),
    EnvVar(
        "EDGEKIT_NETNS",
        "Build host",
        "`0`: run toolchain conversions without a private network namespace (`unshare -n`).",
        "on where the kernel allows it",
        "edge.toolchains.offline",
    ),
    EnvVar(
        "EDGEKIT_SECCOMP",
        "Build host",
        "`0`: run toolchain conversions without the seccomp filter that refuses network sockets.",
        "on where the kernel allows it",
        "edge.toolchains.offline",
    ),
    EnvVar(
        "EDGEKIT_ALLOW_WEAK_OFFLINE",
        "Build host",
        "`1`: convert with the in-process socket guard alone where neither the namespace nor seccomp holds "
        "(logged as a warning, recorded in the manifest). Otherwise such a conversion is refused.",
        "unset: refused",
        "edge.toolchains.offline",
    ),
    EnvVar(
        "EDGEKIT_OFFLINE_ATTEMPTS",
        "Build host",
        "Set by edgekit for its toolchain subprocesses: the file the offline guard appends each refused network "
        "attempt to. Not for users to set.",
        "set per conversion",
        "edge.toolchains.offline",
    ),
    EnvVar(
        "EDGEKIT_OPENVINO_TELEMETRY",
        "Build host",
        "`1`: leave OpenVINO's and NNCF's own telemetry as the user configured it (edgekit declines it by default).",
        "unset: declined",
        "edge.backends.openvino.format",
    ),
    # -- signing and trust ----------------------------------------------------------------------------
    EnvVar(
        "EDGEKIT_KEYS_DIR",
        "Signing and trust",
        "The signing keys directory (`NAME.pem`, `NAME.pub`) of `edgekit keys` and `sign`.",
        "`~/.config/edgekit/keys`",
        "edge.bundle.signing",
    ),
    EnvVar(
        "EDGEKIT_SIGN_KEY",
        "Signing and trust",
        "The key `convert`, `deploy`, `finish` and `sign` sign with when `--sign-key`/`--key` is not given (a name "
        "in the keys directory, or a PEM path); empty means none.",
        "unset: bundles are not signed",
        "edge.bundle.signing",
    ),
    EnvVar(
        "EDGEKIT_TRUST_DIR",
        "Signing and trust",
        "The trust store bundles must be signed for, wherever one is opened (deploy, run, the agent) without "
        "`--trust-dir`.",
        "a local device store's own `trust/`; else no signature check",
        "edge.bundle.trust",
    ),
    # -- shipping to devices ----------------------------------------------------------------------------
    EnvVar(
        "EDGEKIT_SSH_OPTIONS",
        "Shipping",
        "Extra `-o Key=Value` ssh options for `ssh://` device stores (authentication, host keys, timeouts, "
        "algorithms only: options that run commands or redirect the connection are refused).",
        "unset",
        "edge.store.ssh",
    ),
    # -- device: runtimes ----------------------------------------------------------------------------------
    EnvVar(
        "EDGEKIT_ALLOW_CPU_FALLBACK",
        "Device runtimes",
        "`1`: where the Edge TPU delegate cannot be used, run on the CPU instead (every report then says CPU "
        "fallback); the same as the runner option `allow_cpu_fallback` for every command.",
        "unset: refused",
        "edge.backends.litert.format",
    ),
    EnvVar(
        "EDGEKIT_EDGETPU_LIBRARY",
        "Device runtimes",
        "Absolute path of `libedgetpu.so.1` on a device where it is not on the loader's path (device configuration; "
        "a manifest never names a library).",
        "the loader's search path",
        "edge.backends.litert.run",
    ),
    EnvVar(
        "EDGEKIT_ENGINE_CACHE",
        "Device runtimes",
        "Where the TensorRT runner keeps the engines it builds on the device (never inside a bundle, whose files are "
        "hash-verified).",
        "`<store>/engines` for a bundle in a device store, else `$XDG_CACHE_HOME/edgekit/tensorrt-engines` "
        "(`~/.cache/...`)",
        "edge.backends.tensorrt.format",
    ),
    # -- device: agent -----------------------------------------------------------------------------------
    EnvVar(
        "EDGEKIT_MQTT_PASSWORD",
        "Device agent and fleet",
        "The broker password for the agent, the collector and rollouts when `--password-file` is not given (never "
        "on the command line).",
        "unset: no password",
        "edge.mqtt.client",
    ),
    EnvVar(
        "EDGEKIT_APP_SOCKET",
        "Device agent and fleet",
        "For an application reporting its own figures to the agent (`edge.agent.appsocket.report`): the agent's "
        "socket path (the agent's `--source app:PATH`).",
        "`<store>/agent/app.sock`",
        "edge.agent.appsocket",
    ),
    EnvVar(
        "EDGEKIT_STORE",
        "Device agent and fleet",
        "For an application reporting to the agent: the device store whose `agent/app.sock` to use when "
        "`EDGEKIT_APP_SOCKET` is unset.",
        "unset",
        "edge.agent.appsocket",
    ),
    # -- everywhere -------------------------------------------------------------------------------------------
    EnvVar(
        "EDGEKIT_LOG_DIR",
        "Everywhere",
        "Where an internal error's traceback is saved (the one-line error names the file; the newest 50 are kept).",
        "`$XDG_STATE_HOME/edgekit/crashes`, else `~/.local/state/edgekit/crashes`",
        "edge.errors",
    ),
)

BY_NAME = {v.name: v for v in ENVIRONMENT}


def markdown() -> str:
    """The reference page, grouped as :data:`ENVIRONMENT` is."""
    out = [
        "# Environment variables",
        "",
        "Every `EDGEKIT_*` variable edgekit reads, generated from `edge/envvars.py` when the site is built "
        "(a test fails when the code reads one that is not listed there). A command-line option, where one "
        "exists, wins over its variable.",
        "",
    ]
    groups: list[str] = []
    for v in ENVIRONMENT:
        if v.group not in groups:
            groups.append(v.group)
    for g in groups:
        out += [f"## {g}", "", "| variable | what it does | default | read by |", "|---|---|---|---|"]
        for v in ENVIRONMENT:
            if v.group == g:
                out.append(f"| `{v.name}` | {v.meaning} | {v.default} | `{v.read_by}` |")
        out.append("")
    return "\n".join(out)

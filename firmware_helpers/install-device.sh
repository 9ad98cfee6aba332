#!/usr/bin/env bash
# Install the edgekit device agent on a Linux device (Raspberry Pi OS / Debian / Ubuntu / Jetson L4T), as root.
#
#   sudo ./install-device.sh --device-id cam-01 --fleet lab --broker mqtts://broker.example.net:8883 \
#        --runtime litert [--package 'edgekit-ml[mqtt,litert]==X.Y' | --package /path/to/edgekit_ml-X.Y.whl]
#
# What it does, each step idempotent (run it again to upgrade):
#   1. a system user and group `edgekit` (password locked; home /var/lib/edgekit: the device store, where
#      `edgekit deploy --device ssh://edgekit@DEVICE/var/lib/edgekit` writes once a key is in its .ssh);
#   2. a virtual environment in $PREFIX/venv (default /opt/edgekit) with edgekit-ml and the extras `mqtt`
#      and the runtime's (`litert` for arm-xnnpack and Coral, `onnx` for x86-cpu, `openvino` for Intel, `rknn`
#      for the Rockchip NPU: librknnrt.so must already be in /usr/lib; `executorch` for executorch-xnnpack: the
#      executorch wheel without its declared (export-side) dependencies, and edgekit's C interface to its runtime
#      built once with the device's C++ compiler: no torch);
#   3. the systemd unit edgekit-agent.service (next to this script) in /etc/systemd/system, a drop-in
#      groups.conf adding the device groups of DEVICE_GROUPS that exist here (GPU render nodes, Coral PCIe,
#      Coral USB), and /etc/default/edgekit-agent (mode 0640, root:edgekit) with the device id, fleet and
#      broker, kept when it exists unless new values are given;
#   4. systemctl daemon-reload, then enable --now (unless --no-start).
# --root DIR writes the files under DIR and skips the user, the venv and systemctl (to inspect what it writes).
# docs/device-install.md walks through a Raspberry Pi 5 with it.
set -euo pipefail

DEVICE_GROUPS="render apex plugdev"  # added when they exist: GPU (DRM render), Coral PCIe (gasket), Coral USB
PREFIX=/opt/edgekit
ROOT=""
RUNTIME=litert
PACKAGE=""
DEVICE_ID=""
FLEET=""
BROKER=""
AGENT_OPTS=""
START=1
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  echo "options: --device-id ID --fleet NAME --broker URL [--agent-opts '...'] [--runtime litert|onnx|openvino|rknn|executorch|none]"
  echo "         [--package PIP-SPEC|WHEEL] [--prefix DIR] [--root DIR] [--no-start]"
}

die() {
  echo "install-device.sh: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --device-id) DEVICE_ID=${2:?}; shift 2 ;;
    --fleet) FLEET=${2:?}; shift 2 ;;
    --broker) BROKER=${2:?}; shift 2 ;;
    --agent-opts) AGENT_OPTS=${2?}; shift 2 ;;
    --runtime) RUNTIME=${2:?}; shift 2 ;;
    --package) PACKAGE=${2:?}; shift 2 ;;
    --prefix) PREFIX=${2:?}; shift 2 ;;
    --root) ROOT=${2:?}; shift 2 ;;
    --no-start) START=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
done

case "$RUNTIME" in
  litert | onnx | openvino | rknn) EXTRAS="mqtt,$RUNTIME" ;;
  executorch | none) EXTRAS="mqtt" ;;  # executorch: the wheel goes in --no-deps below
  *) die "--runtime is litert, onnx, openvino, rknn, executorch or none, got '$RUNTIME'" ;;
esac
[ -n "$PACKAGE" ] || PACKAGE="edgekit-ml[$EXTRAS]"
case "$PACKAGE" in  # a wheel or a directory takes the extras after it: path[extras]
  *.whl | /* | ./*) [[ "$PACKAGE" == *"]" ]] || PACKAGE="$PACKAGE[$EXTRAS]" ;;
esac
for v in DEVICE_ID FLEET; do  # the agent checks them too; refused here before anything is written
  val=${!v}
  if [ -n "$val" ] && ! [[ "$val" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]]; then
    die "--${v,,} '$val': letters, digits, '.', '_' and '-' only (1-64)"
  fi
done
[ -z "$BROKER" ] || [[ "$BROKER" =~ ^mqtts?://[^[:space:]\"\']+$ ]] || die "--broker is mqtt://HOST[:PORT] or mqtts://..."
[[ "$AGENT_OPTS" != *[$'\n\"']* ]] || die "--agent-opts may not hold a newline or a double quote"
[ -f "$HERE/edgekit-agent.service" ] || die "edgekit-agent.service is not next to this script ($HERE)"
if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
  die "run it as root (sudo), or with --root DIR to write the files under DIR only"
fi

step() { echo "==> $*"; }

if [ -z "$ROOT" ]; then
  step "user and group edgekit"
  getent group edgekit >/dev/null || groupadd --system edgekit
  id -u edgekit >/dev/null 2>&1 ||
    useradd --system --gid edgekit --home-dir /var/lib/edgekit --no-create-home --shell /bin/sh edgekit
  install -d -m 0750 -o edgekit -g edgekit /var/lib/edgekit

  step "virtual environment $PREFIX/venv: $PACKAGE"
  "$PYTHON" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' ||
    die "$PYTHON is older than 3.10 or has no venv module (apt install python3-venv)"
  install -d -m 0755 "$PREFIX"
  [ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
  "$PREFIX/venv/bin/python" -m pip install --upgrade --quiet pip
  "$PREFIX/venv/bin/python" -m pip install --upgrade --quiet "$PACKAGE"
  if [ "$RUNTIME" = executorch ]; then
    # its declared dependencies (pandas, scikit-learn, hydra-core, torchao...) are the export side's; the runtime
    # libraries in the wheel need libc and libstdc++ only, and edgekit's interface to them is built here once
    command -v "${CXX:-c++}" >/dev/null || die "--runtime executorch builds a small C++ library: apt install g++"
    "$PREFIX/venv/bin/python" -m pip install --upgrade --quiet --no-deps "executorch>=1.5,<1.6"
    "$PREFIX/venv/bin/python" -m edge.backends.executorch.native build
  fi
  "$PREFIX/venv/bin/python" -m edge.agent --help >/dev/null || die "the agent does not start from $PREFIX/venv"
fi

ETC="$ROOT/etc"
step "systemd unit $ETC/systemd/system/edgekit-agent.service"
install -d -m 0755 "$ETC/systemd/system/edgekit-agent.service.d" "$ETC/default"
sed "s#/opt/edgekit/venv#$PREFIX/venv#g" "$HERE/edgekit-agent.service" >"$ETC/systemd/system/edgekit-agent.service"
chmod 0644 "$ETC/systemd/system/edgekit-agent.service"
groups=""
for g in $DEVICE_GROUPS; do
  if getent group "$g" >/dev/null; then groups="$groups $g"; fi
done
{
  echo "# written by install-device.sh: the device groups of ($DEVICE_GROUPS) that exist on this device"
  echo "[Service]"
  [ -z "$groups" ] || echo "SupplementaryGroups=${groups# }"
} >"$ETC/systemd/system/edgekit-agent.service.d/groups.conf"

defaults="$ETC/default/edgekit-agent"
if [ ! -f "$defaults" ] || [ -n "$DEVICE_ID$FLEET$BROKER$AGENT_OPTS" ]; then
  old_id="" old_fleet="" old_broker="" old_opts=""
  if [ -f "$defaults" ]; then  # keep what is not given again (read as data, never sourced)
    old_id=$(sed -n 's/^EDGEKIT_DEVICE_ID=//p' "$defaults")
    old_fleet=$(sed -n 's/^EDGEKIT_FLEET=//p' "$defaults")
    old_broker=$(sed -n 's/^EDGEKIT_BROKER=//p' "$defaults")
    old_opts=$(sed -n 's/^EDGEKIT_AGENT_OPTS=//p' "$defaults")
  fi
  DEVICE_ID=${DEVICE_ID:-${old_id:-$(hostname -s | tr -c 'A-Za-z0-9._\n-' '-')}}
  FLEET=${FLEET:-${old_fleet:-default}}
  BROKER=${BROKER:-${old_broker:-mqtt://localhost:1883}}
  AGENT_OPTS=${AGENT_OPTS:-$old_opts}
  step "settings $defaults (device $DEVICE_ID, fleet $FLEET, broker $BROKER)"
  umask 027
  tmp=$(mktemp "$defaults.XXXXXX")
  printf 'EDGEKIT_DEVICE_ID=%s\nEDGEKIT_FLEET=%s\nEDGEKIT_BROKER=%s\nEDGEKIT_AGENT_OPTS=%s\n' \
    "$DEVICE_ID" "$FLEET" "$BROKER" "$AGENT_OPTS" >"$tmp"
  chmod 0640 "$tmp"
  [ -n "$ROOT" ] || chgrp edgekit "$tmp"
  mv -f "$tmp" "$defaults"
fi

if [ -z "$ROOT" ]; then
  systemctl daemon-reload
  if [ "$START" = 1 ]; then
    step "systemctl enable edgekit-agent; systemctl restart edgekit-agent"
    systemctl enable edgekit-agent
    systemctl restart edgekit-agent  # started, or restarted on the new code after an upgrade
  else
    systemctl enable edgekit-agent
  fi
fi
step "done: journalctl -u edgekit-agent -f shows the agent; deploy with"
echo "    edgekit deploy MODEL --target TARGET --device ssh://edgekit@$(hostname -s 2>/dev/null || echo DEVICE)/var/lib/edgekit"

"""The one script an ``ssh://`` store runs on the device.

It is a constant: the device runs ``sh -c "$REMOTE_SCRIPT" edgekit OP ROOT ARGS...`` and every value
(store path, bundle id, checksums, paths) arrives as a positional argument, quoted by ``shlex`` on
this side; nothing is ever pasted into the script text. The script validates its arguments again
(ids, hashes, paths) and implements the protocol of ``edge.store.base`` step for step, writing the
same files in the same formats as ``DeviceStore``.

Operations (exit 0 on success; messages on stderr start with ``edgekit-store:``):

    state    ROOT                                 raw facts: intent line, current, previous
    history  ROOT                                 the state, a line '--', history.jsonl
    manifest ROOT ID                              bundles/ID/manifest.json
    install  ROOT TIMEOUT ID UPLOAD SHA PATH...   UPLOAD=1: a tar of the bundle on stdin;
                                                  UPLOAD=0 and the bundle is not there: exit 3
    rollback ROOT TIMEOUT EXPECTED SHA PATH...    switch to previous, which must be EXPECTED

Exit codes: 3 upload needed, 65 damaged store, 66 bad argument, 67 no store, 68 verification
failed, 69 nothing to roll back to, 70 changed meanwhile, 74 I/O error, 75 lock timeout.
Device needs: a POSIX sh, readlink, ln, mv -T, mktemp, tar, sha256sum, sync, date; flock(1)
(util-linux or busybox) for the lock, else a mkdir lock whose dead owner is detected with kill -0.
"""

REMOTE_SCRIPT = r"""
set -u
export LC_ALL=C
umask 022
say() { printf 'edgekit-store: %s\n' "$*" >&2; }
die() { c=$1; shift; say "$@"; exit "$c"; }
valid_id() {
  case $1 in ''|.*|-*|*[!A-Za-z0-9._-]*) return 1 ;; esac
  [ "${#1}" -le 128 ]
}
opt_id() { [ "$1" = - ] || valid_id "$1"; }
sync_all() { sync -f "$root" 2>/dev/null || sync; }

[ "$#" -ge 2 ] || die 66 "bad arguments: need OP ROOT"
op=$1 root=$2
shift 2
case $root in /*) ;; *) die 66 "bad arguments: the store path must be absolute" ;; esac
B="$root/bundles"

link_id() {  # the bundle id link $1 names, empty when absent (run in $(...): callers add '|| exit')
  l="$root/$1"
  if [ -L "$l" ]; then
    t=$(readlink "$l") || die 74 "cannot read $1"
    id=${t#bundles/}
    if [ "$id" = "$t" ] || ! valid_id "$id"; then
      die 65 "damaged $1 badlink $(printf '%s' "$t" | tr '\n\r' '??' | head -c 200)"
    fi
    printf '%s' "$id"
  elif [ -d "$l" ]; then die 65 "damaged $1 dir"
  elif [ -e "$l" ]; then die 65 "damaged $1 file"
  fi
}

read_intent() {  # sets i_*; 1 when there is none
  f="$root/.intent"
  [ -e "$f" ] || [ -L "$f" ] || return 1
  if [ -L "$f" ] || [ ! -f "$f" ]; then die 65 "damaged .intent record"; fi
  i_v= i_txn= i_action= i_new= i_old= i_pb= i_pa= i_time= i_rest=
  IFS=' ' read -r i_v i_txn i_action i_new i_old i_pb i_pa i_time i_rest < "$f" || true
  case $i_txn in ''|*[!A-Za-z0-9-]*) die 65 "damaged .intent record" ;; esac
  case $i_action in deploy|rollback) ;; *) die 65 "damaged .intent record" ;; esac
  case $i_time in ''|*[!0-9T:+.-]*) die 65 "damaged .intent record" ;; esac
  if [ "$i_v" != v1 ] || [ -n "$i_rest" ] || ! valid_id "$i_new" || ! opt_id "$i_old" || ! opt_id "$i_pb" \
     || ! opt_id "$i_pa"; then die 65 "damaged .intent record"; fi
  return 0
}

set_link() {  # set_link NAME ID|-   (renamed over the old link; '-' removes it)
  rm -f "$root/.$1.tmp"
  if [ "$2" = - ]; then
    rm -f "$root/$1" || die 74 "cannot remove $1"
  else
    { ln -s "bundles/$2" "$root/.$1.tmp" && mv -T -f "$root/.$1.tmp" "$root/$1"; } || die 74 "cannot switch $1"
  fi
  sync_all
}

append_history() {  # ACTION NEW OLD|- TXN TIME NOTE  (same bytes as edge.store.base.history_line)
  h="$root/history.jsonl"
  if [ -s "$h" ] && [ -n "$(tail -c 1 "$h")" ]; then printf '\n' >> "$h"; fi
  rep=null
  [ "$3" = - ] || rep="\"$3\""
  note=
  [ -z "$6" ] || note=", \"note\": \"$6\""
  printf '{"time": "%s", "action": "%s", "current": "%s", "replaced": %s, "txn": "%s"%s}\n' \
    "$5" "$1" "$2" "$rep" "$4" "$note" >> "$h" || die 74 "cannot write history.jsonl"
  sync_all
}

lock() {  # TIMEOUT
  L="$root/.lock"
  if [ -L "$L" ] || { [ -e "$L" ] && [ ! -f "$L" ]; }; then die 65 "damaged .lock notfile"; fi
  if command -v flock >/dev/null 2>&1; then
    touch "$L" 2>/dev/null || die 74 "cannot write $L"
    exec 9>>"$L"
    if ! flock -w "$1" 9; then die 75 "busy $(head -c 32 "$L" | tr -cd '0-9')"; fi
    printf '%s\n' "$$" > "$L"
  else
    D="$root/.lock.d" n=0
    until mkdir "$D" 2>/dev/null; do
      o=$(head -c 32 "$D/pid" 2>/dev/null | tr -cd '0-9')
      if [ -n "$o" ] && ! kill -0 "$o" 2>/dev/null; then  # its owner is gone: take the lock over
        mv "$D" "$root/.lock.stale.$$" 2>/dev/null && rm -rf "$root/.lock.stale.$$"
        continue
      fi
      n=$((n + 1))
      [ "$n" -le "$1" ] || die 75 "busy $o"
      sleep 1
    done
    printf '%s\n' "$$" > "$D/pid"
    trap 'rm -rf "$D"' EXIT
    trap 'exit 143' HUP INT TERM
  fi
}

recover() {  # finish or undo a switch a killed writer left; remove leftovers (under the lock)
  if read_intent; then
    cur=$(link_id current) || exit
    prv=$(link_id previous) || exit
    if [ "$cur" = "$i_new" ]; then
      [ "${prv:--}" = "$i_pa" ] || set_link previous "$i_pa"
      if ! { [ -f "$root/history.jsonl" ] && tail -n 1 "$root/history.jsonl" | grep -qF "\"txn\": \"$i_txn\""; }; then
        append_history "$i_action" "$i_new" "$i_old" "$i_txn" "$i_time" "completed after an interruption"
      fi
    else
      [ "${prv:--}" = "$i_pb" ] || set_link previous "$i_pb"
    fi
    rm -f "$root/.intent" || die 74 "cannot remove .intent"
    sync_all
  fi
  if [ -L "$B" ] || { [ -e "$B" ] && [ ! -d "$B" ]; }; then die 65 "damaged bundles notdir"; fi
  for e in "$B"/.[!.]* "$B"/..?* "$root"/.current.tmp* "$root"/.previous.tmp* "$root"/.intent.tmp* \
           "$root"/.lock.stale.*; do
    if [ -e "$e" ] || [ -L "$e" ]; then rm -rf -- "$e" || die 74 "cannot remove a leftover"; fi
  done
  h="$root/history.jsonl"
  if [ -L "$h" ] || { [ -e "$h" ] && [ ! -f "$h" ]; }; then die 65 "damaged history.jsonl notfile"; fi
  cur=$(link_id current) || exit
  prv=$(link_id previous) || exit
}

sums=
nl='
'
take_sums() {  # SHA PATH ... -> $sums, a sha256sum -c list
  [ "$#" -ge 2 ] || die 66 "bad arguments: no checksums"
  while [ "$#" -ge 2 ]; do
    case $1 in *[!0-9a-f]*) die 66 "bad arguments: a checksum is not hex" ;; esac
    [ "${#1}" -eq 64 ] || die 66 "bad arguments: a checksum is not sha256"
    case $2 in ''|/*|..|../*|*/..|*/../*|.|./*|*/.|*/./*|*//*|*\\*) die 66 "bad arguments: bad artifact path" ;; esac
    case $2 in *"$nl"*) die 66 "bad arguments: bad artifact path" ;; esac
    sums="$sums$1  $2
"
    shift 2
  done
  [ "$#" -eq 0 ] || die 66 "bad arguments: odd checksum list"
}
verify() { (cd "$1" 2>/dev/null && printf '%s' "$sums" | sha256sum -c - >/dev/null 2>&1); }

switch() {  # ACTION NEW   (cur/prv set by recover)
  now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
  rnd=$(od -An -N4 -tx1 /dev/urandom 2>/dev/null | tr -cd '0-9a-f')
  txn="$(date -u +%Y%m%dT%H%M%SZ)-$$-${rnd:-0}"
  if [ "$cur" = "$2" ]; then
    append_history "$1" "$2" "$2" "$txn" "$now" "already current"
    printf '%s\n' "$2"
    return 0
  fi
  old=${cur:--} pb=${prv:--}
  pa=$pb
  [ -z "$cur" ] || pa=$cur
  { printf 'v1 %s %s %s %s %s %s %s\n' "$txn" "$1" "$2" "$old" "$pb" "$pa" "$now" > "$root/.intent.tmp" \
    && sync_all && mv -T -f "$root/.intent.tmp" "$root/.intent"; } || die 74 "cannot write .intent"
  sync_all
  [ "$pa" = "$pb" ] || set_link previous "$pa"
  set_link current "$2"
  append_history "$1" "$2" "$old" "$txn" "$now" ""
  rm -f "$root/.intent" || die 74 "cannot remove .intent"
  printf '%s\n' "$2"
}

state() {  # raw facts for the reader: the intent line, then each link
  [ -d "$root" ] || { echo absent; return 0; }
  if [ -f "$root/.intent" ]; then printf 'intent %s\n' "$(head -n 1 "$root/.intent" | head -c 1024)"
  elif [ -e "$root/.intent" ] || [ -L "$root/.intent" ]; then echo 'intent ?'
  else echo 'intent -'; fi
  for n in current previous; do
    if [ -L "$root/$n" ]; then
      t=$(readlink "$root/$n")
      printf '%s link %s\n' "$n" "$(printf '%s' "$t" | tr '\n\r' '??' | head -c 1024)"
    elif [ -d "$root/$n" ]; then echo "$n dir"
    elif [ -e "$root/$n" ]; then echo "$n file"
    else echo "$n none"; fi
  done
}

case $op in
state) state ;;
history)
  h="$root/history.jsonl"
  if [ -L "$h" ] || { [ -e "$h" ] && [ ! -f "$h" ]; }; then die 65 "damaged history.jsonl notfile"; fi
  state
  echo '--'
  [ ! -f "$h" ] || cat "$h"
  ;;
manifest)
  [ "$#" -eq 1 ] && valid_id "$1" || die 66 "bad arguments: bundle id"
  m="$B/$1/manifest.json"
  [ -f "$m" ] || die 67 "no manifest for $1"
  head -c 4194304 "$m"
  ;;
install)
  [ "$#" -ge 3 ] || die 66 "bad arguments: install"
  timeout=$1 id=$2 upload=$3
  shift 3
  case $timeout in ''|*[!0-9]*) die 66 "bad arguments: timeout" ;; esac
  valid_id "$id" || die 66 "bad arguments: bundle id"
  case $upload in 0|1) ;; *) die 66 "bad arguments: upload flag" ;; esac
  take_sums "$@"
  if [ -e "$root" ] && [ ! -d "$root" ]; then die 66 "store path is not a directory"; fi
  mkdir -p "$root" || die 74 "cannot create $root"
  lock "$timeout"
  recover
  mkdir -p "$B" || die 74 "cannot create $B"
  dest="$B/$id"
  have=0
  if [ -e "$dest" ] || [ -L "$dest" ]; then
    if [ -d "$dest" ] && [ ! -L "$dest" ] && verify "$dest"; then have=1
    else  # damaged: move aside, remove, replace
      mv -T "$dest" "$B/.partial-damaged-$$" && rm -rf -- "$B/.partial-damaged-$$" || die 74 "cannot replace $id"
    fi
  fi
  if [ "$have" = 1 ]; then
    [ "$upload" = 0 ] || cat > /dev/null
  else
    [ "$upload" = 1 ] || exit 3
    stage=$(mktemp -d "$B/.partial-XXXXXXXXXX") || die 74 "cannot create a staging directory"
    chmod 755 "$stage" || die 74 "cannot create a staging directory"
    if ! (cd "$stage" && tar -x -o -f -); then
      rm -rf -- "$stage"
      die 68 "transfer failed: the bundle did not arrive whole"
    fi
    if ! verify "$stage"; then
      rm -rf -- "$stage"
      die 68 "verification failed: the bundle failed sha256 verification on the device"
    fi
    sync_all
    mv -T "$stage" "$dest" || die 74 "cannot rename the staged bundle"
    sync_all
  fi
  switch deploy "$id"
  ;;
rollback)
  [ "$#" -ge 2 ] || die 66 "bad arguments: rollback"
  timeout=$1 expected=$2
  shift 2
  case $timeout in ''|*[!0-9]*) die 66 "bad arguments: timeout" ;; esac
  valid_id "$expected" || die 66 "bad arguments: bundle id"
  take_sums "$@"
  [ -d "$root" ] || die 67 "absent"
  lock "$timeout"
  recover
  [ -n "$prv" ] || die 69 "no previous"
  [ "$prv" = "$expected" ] || die 70 "changed meanwhile"
  verify "$B/$prv" || die 68 "verification failed: the previous bundle failed sha256 verification on the device"
  switch rollback "$prv"
  ;;
*) die 66 "bad arguments: unknown operation" ;;
esac
"""

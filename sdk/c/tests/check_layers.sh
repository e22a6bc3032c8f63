#!/bin/sh
# The C SDK's two layers never call each other: the parse layer (JSON -> ldp_program) and the run
# layer (ldp_program -> randomized report) share only src/program_types.h; the files above them
# (state, device, ledger, batch) may call both, and neither layer calls up into them. Both may
# call the base (error messages), which calls none of the others.
#
#   check_layers.sh [--src DIR] parse OBJ... run OBJ... above OBJ... base OBJ...
#
# (an OBJ argument may also be a ;-separated list of objects).
# Fails when an object of one layer has an undefined symbol that an object of the other layer (or
# of the files above) defines, when a base object uses a symbol any other group defines, and, with --src, when a parse_*.c file includes run.h or a run_*.c
# file includes parse.h.
set -eu

src=
if [ "${1:-}" = --src ]; then
  src=$2
  shift 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/parse"
: >"$tmp/run"
: >"$tmp/above"
: >"$tmp/base"
group=
for arg in "$@"; do
  # an argument may be a ;-separated list (ctest passes $<TARGET_OBJECTS:...> so)
  printf '%s\n' "$arg" | tr ';' '\n' >"$tmp/args"
  while IFS= read -r a; do
    case $a in
      parse | run | above | base) group=$a ;;
      '') ;;
      *)
        [ -n "$group" ] || { echo "check_layers: name a group (parse, run, above, base) first" >&2; exit 2; }
        [ -f "$a" ] || { echo "check_layers: no object $a" >&2; exit 2; }
        echo "$a" >>"$tmp/$group"
        ;;
    esac
  done <"$tmp/args"
done
for g in parse run; do
  [ -s "$tmp/$g" ] || { echo "check_layers: no $g objects given" >&2; exit 2; }
done

# the external symbols a group of objects defines
defined() {
  while read -r o; do nm -g --defined-only "$o" | awk 'NF >= 3 { print $3 }'; done <"$tmp/$1" |
    sort -u
}
defined parse >"$tmp/parse.def"
defined run >"$tmp/run.def"
defined above >"$tmp/above.def"

status=0
# check LAYER OTHER...: no object of LAYER uses a symbol an OTHER group defines
check() {
  layer=$1
  shift
  while read -r o; do
    nm -u "$o" | awk '{ print $NF }' | sort -u >"$tmp/undef"
    for other in "$@"; do
      for s in $(comm -12 "$tmp/undef" "$tmp/$other.def"); do
        echo "check_layers: $layer object $(basename "$o") uses $s, defined by the $other files"
        status=1
      done
    done
  done <"$tmp/$layer"
}
check parse run above
check run parse above
check base parse run above

if [ -n "$src" ]; then
  for f in "$src"/parse_*.c; do
    [ -e "$f" ] || continue
    if grep -Eq '^[[:space:]]*#[[:space:]]*include[[:space:]]*"run\.h"' "$f"; then
      echo "check_layers: $(basename "$f") includes run.h"
      status=1
    fi
  done
  for f in "$src"/run_*.c; do
    [ -e "$f" ] || continue
    if grep -Eq '^[[:space:]]*#[[:space:]]*include[[:space:]]*"parse\.h"' "$f"; then
      echo "check_layers: $(basename "$f") includes parse.h"
      status=1
    fi
  done
fi
[ $status -eq 0 ] && echo "check_layers: the parse and run layers do not call each other"
exit $status

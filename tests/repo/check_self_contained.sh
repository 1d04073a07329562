#!/usr/bin/env bash
# A fresh clone must be complete on its own. Fails (exit 1) when
#   1. a file of the repository refers to something outside it: the reference folder that sits
#      next to a checkout on the build machine, a developer's work or home folder, or a path
#      built by climbing out of the source root; or
#   2. a test can skip on a CPU-only machine for a reason other than a missing GPU (every
#      GTEST_SKIP line under tests/ must name CUDA or the GPU).
# Files: those git tracks (a fresh clone's content); outside a git checkout, every file except
# build outputs. Binary files are not read.
#
# Usage: check_self_contained.sh ROOT      check a tree
#        check_self_contained.sh --self-test   show that each rule fires on a bad sample
set -uo pipefail

# Written with a bracket in each so that this file does not match its own patterns.
OUTSIDE_PATTERNS=(
  '\.\./share[d]'                                   # the sibling reference folder
  'share[d]/(data|spec)/'                           # ... or paths inside it
  '(^|[^[:alnum:]_.~-])/wor[k]([/"'"'"'[:space:]:;,)]|$)'  # the build machine's work folder
  '(^|[^[:alnum:]_.~-])/(hom[e]|roo[t]|User[s])/'   # home folders
  '(SOURCE_DI[R]|ROO[T])[^[:space:]]{0,4}[[:space:]]*[+,]?[[:space:]]*"?/?\.\.["/]'  # climbing out of the root
)
SKIP_PATTERN='GTEST_SKI[P]'
SKIP_ALLOWED='CUDA|GPU'

list_files() {  # ROOT -> NUL-separated relative paths
  local root="$1"
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
     [[ "$(git -C "$root" rev-parse --show-toplevel)" == "$(cd "$root" && pwd -P)" ]]; then
    git -C "$root" ls-files -z
  else
    (cd "$root" && find . \( -name .git -o -name 'build*' -o -name gpu -o -name out -o -name .venv \
        -o -name __pycache__ \) -prune -o -type f -print0 | sed -z 's|^\./||')
  fi
}

check_tree() {  # ROOT -> prints offences, returns 1 if any
  local root="$1" bad=0 hits
  local -a files=()
  mapfile -d '' files < <(list_files "$root")
  ((${#files[@]})) || { echo "no files found under $root"; return 1; }
  local p
  for p in "${OUTSIDE_PATTERNS[@]}"; do
    hits=$(cd "$root" && printf '%s\0' "${files[@]}" | xargs -0 -r grep -I -n -E -- "$p" 2>/dev/null | cut -c1-200)
    if [[ -n "$hits" ]]; then
      echo "refers outside the repository (pattern $p):"
      echo "$hits" | sed 's/^/  /'
      bad=1
    fi
  done
  local -a tests=()
  for p in "${files[@]}"; do
    [[ "$p" == tests/* && "$p" =~ \.(cpp|h|cu|cuh)$ ]] && tests+=("$p")
  done
  if ((${#tests[@]})); then
    hits=$(cd "$root" && printf '%s\0' "${tests[@]}" | xargs -0 -r grep -n -E -- "$SKIP_PATTERN" 2>/dev/null |
           grep -v -E -- "$SKIP_ALLOWED" | cut -c1-200)
    if [[ -n "$hits" ]]; then
      echo "a test skips for a reason other than a missing GPU (CPU-only machines must run it):"
      echo "$hits" | sed 's/^/  /'
      bad=1
    fi
  fi
  return $bad
}

self_test() {
  local tmp fails=0 name
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  # Bad samples, assembled at run time so this file stays clean.
  local w="wo""rk" s="sha""red" h="ho""me" k="GTEST_""SKIP"
  local -A bad=(
    [sibling]="path = ROOT_DIR + \"/../$s/data/tok.json\""
    [inside]="see $s/spec/qwen38.md"
    [work]="python=/$w/venv/bin/python"
    [home]="cp /$h/someone/model ."
    [climb]="const std::string d = std::string(QFLASH_SOURCE_DIR) + \"/../other\";"
    [climb_py]="path = os.path.join(ROOT, \"..\", \"data\")"
  )
  for name in "${!bad[@]}"; do
    mkdir -p "$tmp/$name"
    printf '%s\n' "${bad[$name]}" >"$tmp/$name/file.txt"
    if check_tree "$tmp/$name" >/dev/null; then echo "self-test: '$name' sample not detected"; fails=1; fi
  done
  mkdir -p "$tmp/skip/tests/unit"
  printf '  if (!f) %s() << "fixture missing";\n' "$k" >"$tmp/skip/tests/unit/a_test.cpp"
  if check_tree "$tmp/skip" >/dev/null; then echo "self-test: non-GPU skip not detected"; fails=1; fi
  mkdir -p "$tmp/clean/tests/unit"
  printf '  if (!be) %s() << "no CUDA device";\n' "$k" >"$tmp/clean/tests/unit/a_test.cpp"
  printf 'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"\n/tmp/x /usr/lib/python3 shared memory\n' \
    >"$tmp/clean/ok.sh"
  if ! check_tree "$tmp/clean"; then echo "self-test: clean sample rejected"; fails=1; fi
  ((fails)) && return 1
  echo "self-test: every rule fires on its bad sample, the clean sample passes"
}

case "${1:-}" in
  --self-test) self_test ;;
  ""|-h|--help) sed -n '2,12p' "$0"; exit 2 ;;
  *)
    if check_tree "$1"; then echo "self-contained: no reference outside the repository, no non-GPU skip"; exit 0; fi
    echo "fix: keep data in the repository (tests/fixtures, extracted at build time if large) and"
    echo "     paths relative to it; a test may skip only when it needs a GPU that is absent"
    exit 1
    ;;
esac

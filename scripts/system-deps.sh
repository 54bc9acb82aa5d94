#!/usr/bin/env bash
# Install the Debian packages the test suite needs, only those that are missing.
set -euo pipefail
declare -A want=(
  [chromium]=chromium
  [clang-16]=clang-16
  [lld-link-16]=lld-16
  [cabextract]=cabextract
  [npm]=npm
  [perf]=linux-perf
)
# Crates of Debian's registry (/usr/share/cargo/registry) that the perf tests' recorded workspace depends on
# (tests/realbuild.py DEBIAN_CRATES): crate -> package.
declare -A crates=(
  [itoa]=librust-itoa-dev
  [fnv]=librust-fnv-dev
)
missing=()
for cmd in "${!want[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
for crate in "${!crates[@]}"; do
  compgen -G "/usr/share/cargo/registry/$crate-*" >/dev/null || missing+=("${crates[$crate]}")
done
if ((${#missing[@]})); then
  echo "system-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

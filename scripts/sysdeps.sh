#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing:
#   chromium   - the headless browser that checks the built book
#   bubblewrap - the sandbox that runs student code in the autograder
#   npm        - fetches MathJax once (npm registry) so the book serves it locally
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v npm >/dev/null 2>&1 || need+=(npm)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "error: missing system packages: ${need[*]}. Install them with: apt-get install ${need[*]}" >&2; exit 1
  fi
else SUDO=""; fi
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null

#!/usr/bin/env bash
# Debian's Slurm with accounting for the local stack, Chromium for the tests that screenshot
# the Prefect UI (tests/ui_screenshot.py), podman and squashfs-tools for the image stage's build
# (tests/test_image_stage.py): idempotent, quiet when already installed, a no-op
# (exit 0) where it cannot run (not root, or no apt).
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server chromium podman squashfs-tools)

if dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -qv "install ok installed" \
   || [ "$(dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | wc -l)" -ne "${#packages[@]}" ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-debian.sh: not root or no apt-get; install ${packages[*]} yourself for the local Slurm cluster, the UI screenshots and the image build"
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  echo "install-debian.sh: installed ${packages[*]}"
fi

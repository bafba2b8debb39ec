#!/usr/bin/env bash
# Install Debian's bubblewrap, the namespace sandbox behind tests/containers/singularity (Debian 12
# packages no apptainer/singularity). Does nothing when bwrap is already there. Needs root and apt;
# used by the container tests only (tests/slurm/test_containers.py), never on a user's cluster.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-sandbox: bwrap is missing and this is not a root shell with apt-get; install bubblewrap by hand" >&2
    exit 2
fi
echo "install-sandbox: installing bubblewrap" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
command -v bwrap >/dev/null 2>&1 || { echo "install-sandbox: bwrap still missing after the install" >&2; exit 1; }

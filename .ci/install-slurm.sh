#!/usr/bin/env bash
# Install Debian's SLURM daemons, clients and munge for the local 2-node test
# cluster (tests/slurm/cluster.sh). Does nothing when they are already there.
# Needs root and apt; never used on a user's cluster.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)
NEEDED_COMMANDS=(slurmctld slurmd sbatch srun squeue sinfo scontrol scancel munged)

missing_commands() {
    local c out=()
    for c in "${NEEDED_COMMANDS[@]}"; do
        command -v "$c" >/dev/null 2>&1 || out+=("$c")
    done
    echo "${out[*]:-}"
}

missing=$(missing_commands)
if [[ -z "$missing" ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "install-slurm: missing commands ($missing) and not root: cannot apt-get install ${PACKAGES[*]}" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-slurm: missing commands ($missing) and no apt-get on this machine; install ${PACKAGES[*]} by hand" >&2
    exit 2
fi

# The packages' maintainer scripts would start system-wide munged/slurmctld/slurmd
# from /etc; the test cluster runs its own from its own directory, so forbid
# service starts during the install (policy-rc.d exit 101), and only if we put
# that file there do we remove it again.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created_policy=1
fi
cleanup() { if [[ $created_policy -eq 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-slurm: installing ${PACKAGES[*]} (missing: $missing)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null

missing=$(missing_commands)
if [[ -n "$missing" ]]; then
    echo "install-slurm: still missing after install: $missing" >&2
    exit 1
fi

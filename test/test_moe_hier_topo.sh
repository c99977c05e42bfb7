#!/usr/bin/env bash
# Hierarchical MoE dispatch with the topology declared for the whole job (HCOMM_TOPO): on the
# local backend, whose inter-node links are then simulated, nodes=2x2 and nodes=2x4 give
# bitwise the flat path's results and one inter-node row per (token, remote node)
# (test_moe_hier's job-topology mode).
set -euo pipefail
build=$1
for topo in nodes=2x2 nodes=2x4 "nodes=2x4;inter=20us,2GB/s"; do
    HCOMM_BACKEND=local HCOMM_TOPO="$topo" timeout 300 "$build/test/test_moe_hier"
done

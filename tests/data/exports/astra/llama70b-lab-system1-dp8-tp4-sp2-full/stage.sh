#!/bin/sh
# Plan dp8-tp4-pp1-sp2 mb1 1f1b full zero0 of llama70b on lab-system1 (64 NPUs), written by
# `planner export --format astra-sim`: STAGE (symbolic_tensor_graph, branch recomp) writes one
# Chakra trace per NPU, then ASTRA-sim's analytical backend runs them. Set
#   STAGE      a checkout of symbolic_tensor_graph at branch recomp (required)
#   ASTRA_SIM  the AstraSim_Analytical_Congestion_Unaware binary (default: on PATH)
#   OUT        where the traces go (default: stage_out next to this file)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/stage_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
ASTRA_SIM=${ASTRA_SIM:-AstraSim_Analytical_Congestion_Unaware}
: "${STAGE:?set STAGE to a checkout of symbolic_tensor_graph, branch recomp}"

# 1. STAGE main.py, unchanged, with ConvertChakra.with_comm_info on: system.json sets
#    track-local-mem, which needs each node's inputs and outputs. Without it this is
#    python3 main.py with the same flags.
cd "$STAGE"
${PYTHON:-python3} -c '
import runpy, sys
from symbolic_tensor_graph.graph.convert_chakra import ConvertChakra
ConvertChakra.with_comm_info = True
sys.argv[0] = "main.py"
runpy.run_path("main.py", run_name="__main__")
' \
    --dp 8 --tp 4 --pp 1 --sp 2 --weight_sharded 0 --activation_recompute 1 \
    --din 32000 --dout 32000 --dmodel 8192 --dff 28672 \
    --head 64 --seq 1024 --batch 512 --num_stacks 80 \
    --output_dir "$OUT" --comm_group_file comm_group.json \
    --output_name lab-system1_dp8_tp4_pp1_sp2_ws0_rc1

# 2. ASTRA-sim reads $OUT/lab-system1_dp8_tp4_pp1_sp2_ws0_rc1.<rank>.et for every rank.
"$ASTRA_SIM" \
    --workload-configuration="$OUT"/lab-system1_dp8_tp4_pp1_sp2_ws0_rc1 \
    --comm-group-configuration="$OUT"/comm_group.json \
    --system-configuration="$HERE/system.json" \
    --network-configuration="$HERE/network.yml" \
    --remote-memory-configuration="$HERE/remote_memory.json"

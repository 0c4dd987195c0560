#!/usr/bin/env bash
# Two torchrun "nodes" on this machine (loopback), two workers each: one gate group of 4 ranks.
# Run from the repository root after `make setup`:  bash docs/torchrun_loopback.sh
# Prints both nodes' output, their exit codes, and one line per rank's vote log (identical logs share
# a checksum). docs/nodes.md shows a run.
set -u
# shellcheck source=docs/loopback.sh
source "$(dirname "${BASH_SOURCE[0]}")/loopback.sh"
serve=(serve --executor sim --processes --enable-dp-attention --prefill-attempt-interval 4
    --prefill-any-attempt-interval 16 --requests 40 --rate 400 --output-len 24 --port 0 --no-progress
    --vote-log-dir votes)
launch=(torchrun --nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port")
mkdir votes
"${launch[@]}" --node-rank 1 --no-python prefill-gate "${serve[@]}" >node1.txt 2>&1 &
"${launch[@]}" --node-rank 0 --no-python prefill-gate "${serve[@]}" >node0.txt 2>&1
node0=$?
wait $!
node1=$?
# torchrun's own banner (OMP_NUM_THREADS) is left out.
for node in 0 1; do
    echo "== node $node (torchrun --node-rank $node)"
    grep -v -e '^W[0-9]' node$node.txt
done
echo "== exit codes: node 0 $node0, node 1 $node1"
echo "== vote logs (round, point, open, counter, counter after, epoch): $(wc -l <votes/rank0.log) rounds"
md5sum votes/rank*.log
rm -rf "$out"

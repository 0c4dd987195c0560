#!/usr/bin/env bash
# A silent link on loopback: two `serve` node trees of one rank each; node 1's agent is frozen
# (SIGSTOP) mid-run, so its rank keeps running and only the link can tell node 0 that something is
# wrong; it is thawed (SIGCONT) once node 0 exited. Prints how long each node took to exit, their exit
# codes and error lines. Run from the repository root after `make setup`:
#   bash docs/silent_link_loopback.sh
# docs/nodes.md shows a run.
set -u
# shellcheck source=docs/loopback.sh
source "$(dirname "${BASH_SOURCE[0]}")/loopback.sh"
serve=(prefill-gate serve --executor sim --processes --dp-size 2 --enable-dp-attention --no-progress
    --nnodes 2 --master-addr 127.0.0.1 --master-port "$port" --collective-timeout-s 60 --vote-log-dir .)
"${serve[@]}" --node-rank 1 >n1.out 2>n1.err &
agent=$!
"${serve[@]}" --node-rank 0 --port 0 --keep-serving --arrival none >n0.out 2>n0.err &
controller=$!
# Wait for rounds on node 1 (its rank logs one line per round), then freeze its agent.
until [ -s rank1.log ] && [ "$(wc -l <rank1.log)" -ge 5 ]; do sleep 0.1; done
kill -STOP "$agent"
frozen=$SECONDS
wait "$controller"
node0=$?
echo "node0 rc=$node0 after $((SECONDS - frozen)) s"
kill -CONT "$agent"
wait "$agent"
node1=$?
echo "node1 rc=$node1 after $((SECONDS - frozen)) s"
for node in 0 1; do
    echo "== n$node.err"
    cat "n$node.err"
done
# The rank processes both nodes named (agent: "rank pids N", node 0: "rank processes: pids N").
pids=$(sed -n -e 's/.*rank pids \([0-9 ]*\);.*/\1/p' -e 's/.*rank processes: pids \([0-9 ]*\)$/\1/p' n0.out n1.out)
left=""
for pid in $pids; do
    if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi
done
echo "== rank processes ($(echo "$pids" | xargs)) left alive:${left:- none}"
rm -rf "$out"

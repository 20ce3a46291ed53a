#!/usr/bin/env bash
# bench/cluster.sh: the numbers of cluster mode (docs/cluster.md, "Measured").
# Starts three etcd members and three `sandgate serve` nodes on loopback, then
# measures, alternating direct and relayed runs:
#   1. CONNECT + first command (ssh ... true) p50, through the owner vs through another node;
#   2. SFTP throughput (put and get of SIZE_MIB) through the owner vs through another node;
#   3. create p50 (POST /v1/sessions, placed on the receiving node);
#   4. sessions held by the cluster: HOLD creates spread over the nodes, and the RSS it costs.
# Needs: etcd (Debian etcd-server), ssh, sftp, curl, jq. Everything it starts it stops.
# Env: SANDGATE_BIN (default bin/sandgate), REPS (30), SIZE_MIB (256), HOLD (3000),
#      DRIVER (workdir; linux needs root), MAX_SESSIONS (each node's --max-sessions, 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${SANDGATE_BIN:-bin/sandgate}")
reps=${REPS:-30}
size_mib=${SIZE_MIB:-256}
hold=${HOLD:-3000}
driver=${DRIVER:-workdir}
max_sessions=${MAX_SESSIONS:-1000}
for t in etcd ssh sftp curl jq; do command -v $t >/dev/null || { echo "bench/cluster.sh: needs $t" >&2; exit 1; }; done

dir=$(mktemp -d)
pids=()
cleanup() {
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; wait "${pids[$i]}" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
now() { date +%s%N; }
p50() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "load at start: $(cat /proc/loadavg)"
declare -a cport pport
peers=
for i in 0 1 2; do cport[$i]=$(port); pport[$i]=$(port); peers+="m$i=http://127.0.0.1:${pport[$i]},"; done
for i in 0 1 2; do
  etcd --name m$i --data-dir "$dir/etcd$i" --logger zap --log-level error \
    --listen-client-urls http://127.0.0.1:${cport[$i]} --advertise-client-urls http://127.0.0.1:${cport[$i]} \
    --listen-peer-urls http://127.0.0.1:${pport[$i]} --initial-advertise-peer-urls http://127.0.0.1:${pport[$i]} \
    --initial-cluster "${peers%,}" --initial-cluster-state new >"$dir/etcd$i.log" 2>&1 &
  pids+=($!)
done
endpoints=http://127.0.0.1:${cport[0]},http://127.0.0.1:${cport[1]},http://127.0.0.1:${cport[2]}
for i in 0 1 2; do until curl -sf http://127.0.0.1:${cport[$i]}/health >/dev/null; do sleep 0.2; done; done

head -c 32 /dev/urandom | base64 >"$dir/token"
declare -a url
for i in 0 1 2; do
  p=$(port); url[$i]=http://127.0.0.1:$p
  "$bin" serve --listen 127.0.0.1:$p --data-dir "$dir/node$i" --sandbox "$driver" --api-key bench-key \
    --rate-limit 0 --idle-timeout 0 --max-sessions-per-tenant $((hold+10)) --max-sessions "$max_sessions" --keep-sandboxes-on-exit=false --ready-file "$dir/ready$i" \
    --cluster-etcd "$endpoints" --cluster-advertise "${url[$i]}" --cluster-token-file "$dir/token" \
    >"$dir/node$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do until [ -s "$dir/ready$i" ]; do sleep 0.1; done; done
api() { curl -sf -H "Authorization: Bearer bench-key" "$@"; }

s=$(api -X POST -d '{"ttl":28800}' "${url[0]}/v1/sessions")
id=$(jq -r .sessionId <<<"$s")
jq -r .ssh.knownHostsLine <<<"$s" >"$dir/known_hosts"
for k in direct relay; do # an ssh config per way in: through the owner (node 0) or node 1
  u=${url[0]}; [ $k = relay ] && u=${url[1]}
  printf 'Host *\n  ProxyCommand %s proxy --api-url %s %%h\n  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n  BatchMode yes\n  IdentityFile /dev/null\n  User sandbox\n' \
    "$bin" "$u" "$dir/known_hosts" >"$dir/ssh-$k"
done
export SANDBOX_API_TOKEN=bench-key

echo "== 1. CONNECT + first command (ssh $id true), $reps runs each, alternating"
: >"$dir/direct"; : >"$dir/relay"
for ((r=0; r<reps; r++)); do
  for k in direct relay; do
    t0=$(now); ssh -F "$dir/ssh-$k" "$id" true; t1=$(now)
    echo $(( (t1-t0)/1000 )) >>"$dir/$k"
  done
done
d50=$(p50 <"$dir/direct"); r50=$(p50 <"$dir/relay")
echo "direct p50 ${d50} us, relayed p50 ${r50} us, relayed/direct $(awk "BEGIN{printf \"%.2f\", $r50/$d50}")"

echo "== 2. SFTP ${size_mib} MiB put and get, 3 runs each, alternating"
head -c $((size_mib<<20)) /dev/urandom >"$dir/blob"
for k in direct relay; do : >"$dir/put-$k"; : >"$dir/get-$k"; done
for ((r=0; r<3; r++)); do
  for k in direct relay; do
    t0=$(now); sftp -q -F "$dir/ssh-$k" -b - "$id" <<<"put $dir/blob blob" >/dev/null; t1=$(now)
    awk "BEGIN{print $size_mib/(($t1-$t0)/1e9)}" >>"$dir/put-$k"
    t0=$(now); sftp -q -F "$dir/ssh-$k" -b - "$id" <<<"get blob $dir/blob.back" >/dev/null; t1=$(now)
    awk "BEGIN{print $size_mib/(($t1-$t0)/1e9)}" >>"$dir/get-$k"
    rm -f "$dir/blob.back"
  done
done
for op in put get; do
  d=$(p50 <"$dir/$op-direct"); r=$(p50 <"$dir/$op-relay")
  echo "$op: direct ${d} MiB/s, relayed ${r} MiB/s, relayed/direct $(awk "BEGIN{printf \"%.2f\", $r/$d}")"
done
api -X DELETE "${url[0]}/v1/sessions/$id" >/dev/null

echo "== 3. create p50 ($reps creates through node 0, each deleted after)"
: >"$dir/create"
for ((r=0; r<reps; r++)); do
  out=$(curl -s -o "$dir/c.json" -w '%{http_code} %{time_total}' -H "Authorization: Bearer bench-key" -X POST -d '{}' "${url[0]}/v1/sessions")
  [ "${out%% *}" = 201 ] || { echo "create failed: $out $(cat "$dir/c.json")" >&2; exit 1; }
  awk "BEGIN{print ${out#* }*1e6}" >>"$dir/create"
  api -X DELETE "${url[0]}/v1/sessions/$(jq -r .sessionId "$dir/c.json")" >/dev/null
done
echo "create p50 $(p50 <"$dir/create") us"

echo "== 4. sessions held: up to $hold creates, spread over the nodes"
held=0
for ((r=0; r<hold; r++)); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer bench-key" -X POST -d '{"ttl":28800}' "${url[$((r%3))]}/v1/sessions")
  [ "$code" = 201 ] || { echo "create $r: $code"; break; }
  held=$((held+1))
done
total=$(api "${url[1]}/v1/sessions?limit=1" | jq .total)
rss() { awk '/VmRSS/{print $2}' /proc/$1/status; }
nrss=0; erss=0
for i in 0 1 2; do erss=$((erss+$(rss ${pids[$i]}))); nrss=$((nrss+$(rss ${pids[$((i+3))]}))); done
echo "held $held sessions (list through node 1: total $total); gateways' RSS $((nrss/1024)) MiB, etcd's $((erss/1024)) MiB"
echo "load at end: $(cat /proc/loadavg)"

#!/usr/bin/env bash
# End-to-end on kind: build the three images, install the operator with Helm, run
# experiments/acks1-leader-kill.yaml, then experiments/acksall-leader-kill.yaml (one at a
# time: both use three brokers and the machine's cores), print both reports, and fail
# unless acks=1 loses acknowledged records (verdict loss) and acks=all with
# min.insync.replicas=2 does not (verdict clean). On failure every pod's logs, the
# operator's and the objects' descriptions are saved under $E2E_LOGS.
#
# Needs docker, kind, kubectl and helm. Environment:
#   KIND_CLUSTER   cluster name (default undertow-e2e; created unless it exists)
#   NAMESPACE      where the operator and the experiments run (default undertow)
#   E2E_TIMEOUT    seconds to wait for each experiment (default 1200)
#   E2E_LOGS       where logs go on failure (default e2e-logs/)
#   KEEP_CLUSTER=1 keep the cluster afterwards (default: delete it if this script made it)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-undertow-e2e}
NAMESPACE=${NAMESPACE:-undertow}
TIMEOUT=${E2E_TIMEOUT:-1200}
LOGS=${E2E_LOGS:-e2e-logs}
EXPERIMENTS=(acks1-leader-kill acksall-leader-kill)
EXPECTED=(loss clean)

log() { printf '\n==> %s\n' "$*"; }

for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is not installed" >&2; exit 2; }
done

created=0
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "creating kind cluster $CLUSTER"
    kind create cluster --name "$CLUSTER" --wait 180s
    created=1
fi
cleanup() {
    if [[ $created == 1 && ${KEEP_CLUSTER:-0} != 1 ]]; then
        log "deleting kind cluster $CLUSTER"
        kind delete cluster --name "$CLUSTER"
    fi
}
trap cleanup EXIT
kubectl config use-context "kind-$CLUSTER" >/dev/null

log "building images"
ENGINE=docker scripts/images.sh
# The tag scripts/images.sh used: the chart's appVersion.
TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/undertow/Chart.yaml)
for image in minibroker operator analysis; do
    kind load docker-image "undertow/$image:$TAG" --name "$CLUSTER"
done

log "installing the operator with Helm into $NAMESPACE"
# The fault agent needs NET_ADMIN: the namespace admits privileged pods.
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite
helm upgrade --install undertow helm/undertow --namespace "$NAMESPACE" \
    --set images.pullPolicy=Never --wait --timeout 5m

diagnose() {
    log "diagnostics (saved under $LOGS)"
    mkdir -p "$LOGS"
    kubectl -n "$NAMESPACE" get all,brokerclusters,chaosexperiments,pvc,configmaps -o wide \
        > "$LOGS/objects.txt" 2>&1 || true
    kubectl -n "$NAMESPACE" describe brokerclusters,chaosexperiments,pods,jobs \
        > "$LOGS/describe.txt" 2>&1 || true
    kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp > "$LOGS/events.txt" 2>&1 || true
    kubectl -n "$NAMESPACE" logs deployment/undertow-operator --all-containers \
        > "$LOGS/operator.log" 2>&1 || true
    for pod in $(kubectl -n "$NAMESPACE" get pods -o name 2>/dev/null); do
        name=${pod#pod/}
        kubectl -n "$NAMESPACE" logs "$pod" --all-containers --prefix \
            > "$LOGS/$name.log" 2>&1 || true
        kubectl -n "$NAMESPACE" logs "$pod" --all-containers --prefix --previous \
            > "$LOGS/$name.previous.log" 2>/dev/null || rm -f "$LOGS/$name.previous.log"
    done
    tail -n 50 "$LOGS/operator.log" || true
    echo "kind-e2e: logs of every pod and the operator are in $LOGS/" >&2
}

for experiment in "${EXPERIMENTS[@]}"; do
    log "running $experiment (at most ${TIMEOUT}s)"
    kubectl -n "$NAMESPACE" apply -f "experiments/$experiment.yaml"
    deadline=$((SECONDS + TIMEOUT))
    while :; do
        phase=$(kubectl -n "$NAMESPACE" get chaosexperiment "$experiment" \
            -o jsonpath='{.status.phase}' 2>/dev/null || true)
        [[ $phase == Completed ]] && break
        if [[ $phase == Failed || $SECONDS -ge $deadline ]]; then
            echo "kind-e2e: $experiment is ${phase:-without a phase} after $((SECONDS))s" >&2
            diagnose
            exit 1
        fi
        sleep 5
    done
done

log "reports"
kubectl -n "$NAMESPACE" get chaosexperiments
status=0
for i in "${!EXPERIMENTS[@]}"; do
    experiment=${EXPERIMENTS[$i]}
    printf '\n--- %s report.json ---\n' "$experiment"
    kubectl -n "$NAMESPACE" get configmap "$experiment-report" -o jsonpath='{.data.report\.json}'
    echo
    verdict=$(kubectl -n "$NAMESPACE" get chaosexperiment "$experiment" \
        -o jsonpath='{.status.verdict}')
    lost=$(kubectl -n "$NAMESPACE" get chaosexperiment "$experiment" \
        -o jsonpath='{.status.counts.lost}')
    echo "$experiment: verdict $verdict (lost ${lost:-?}), expected ${EXPECTED[$i]}"
    [[ $verdict == "${EXPECTED[$i]}" ]] || status=1
done
if [[ $status != 0 ]]; then
    diagnose
    echo "kind-e2e: FAILED: the verdicts are not loss and clean" >&2
fi
exit $status

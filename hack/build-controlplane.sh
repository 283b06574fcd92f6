#!/usr/bin/env bash
# Build the real Kubernetes control plane (controlplane/: one binary with etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager) into .cache/controlplane/<pin>/kube-controlplane.
# Rebuilds only when controlplane/go.mod, go.sum, a .go file or this script changes (content
# hash, not mtime); builds into a temporary file and renames it, so a failed build leaves no
# half-written binary. GOCACHE/GOMODCACHE are Go's defaults (outside the repository).
# CONTROLPLANE_CACHE puts the binaries elsewhere (the tests of this script use it).
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
SRC=controlplane
say() { echo "controlplane: $*"; }
fail() { echo "controlplane: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "Go is not installed; the control plane is built from Go modules (need go >= 1.26: apt-get install golang-go, or put go on PATH)"
GOVER=$(go env GOVERSION)
minor=$(sed -E 's/^go1\.([0-9]+).*/\1/' <<<"$GOVER")
[[ "$minor" =~ ^[0-9]+$ && "$minor" -ge 26 ]] || fail "$GOVER is too old; k8s.io/kubernetes $(awk '$1=="k8s.io/kubernetes"{print $2}' $SRC/go.mod) needs go >= 1.26"

PIN=$(awk '$1=="k8s.io/kubernetes"{print $2}' $SRC/go.mod)
[[ -n "$PIN" ]] || fail "no k8s.io/kubernetes requirement in $SRC/go.mod"
OUT_DIR=${CONTROLPLANE_CACHE:-.cache/controlplane}/$PIN
OUT=$OUT_DIR/kube-controlplane
KEY=$(cat $SRC/go.mod $SRC/go.sum $SRC/*.go "$SELF" | sha256sum | cut -d' ' -f1)
if [[ -x "$OUT" && -f "$OUT.key" && "$(cat "$OUT.key")" == "$KEY" ]]; then
  say "$OUT is up to date (k8s.io/kubernetes $PIN)"
  exit 0
fi

# Disk: the module cache (~1 GB) and the build cache (~4 GB for this build) plus the binary.
GOCACHE_DIR=$(go env GOCACHE)
mkdir -p "$GOCACHE_DIR"
free_kb=$(df -Pk "$GOCACHE_DIR" | awk 'NR==2{print $4}')
(( free_kb >= 6 * 1024 * 1024 )) || fail "only $((free_kb / 1024 / 1024)) GB free under $GOCACHE_DIR; building the control plane needs >= 6 GB"

# Modules: from the local module cache if complete, else from the module proxy.
if ! (cd $SRC && GOPROXY=off GOFLAGS=-mod=mod go mod download >/dev/null 2>&1); then
  say "downloading the Go modules of k8s.io/kubernetes $PIN (about 700 MB, once)"
  if ! err=$(cd $SRC && timeout 900 go mod download 2>&1); then
    fail "the Go module proxy ($(go env GOPROXY)) does not answer or refused a module: $(tail -1 <<<"$err")"
  fi
fi

say "building kube-controlplane for k8s.io/kubernetes $PIN (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)"
say "this happens once per pin and takes about 20 minutes on 2 cores (much less with a warm Go build cache)"
# The version the apiserver reports (/version, kubectl version) and clients check, set as
# Kubernetes' own build does (hack/lib/version.sh): -X on component-base's and client-go's
# version variables; the build date is the release's module time, so the binary is reproducible.
RELEASED=$(cd $SRC && go list -m -f '{{.Time}}' k8s.io/kubernetes | cut -d' ' -f1)
MINOR=$(cut -d. -f2 <<<"$PIN")
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$PIN -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
  LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${RELEASED}T00:00:00Z"
done
mkdir -p "$OUT_DIR"
TMP=$(mktemp "$OUT_DIR/.kube-controlplane.XXXXXX")
LOG=$(mktemp)
trap 'rm -f "$TMP" "$LOG"' EXIT
start=$SECONDS
TMP_ABS=$(realpath "$TMP")
(cd $SRC && go build -v -trimpath -ldflags="$LDFLAGS" -o "$TMP_ABS" .) >"$LOG" 2>&1 &
pid=$!
# Progress: `go build -v` names each package as it compiles it (about 2,000 for this binary).
last=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  (( SECONDS - last >= 30 )) || continue
  last=$SECONDS
  say "  ... $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s, $(grep -cv '^#' "$LOG" || true) packages compiled"
done
if ! wait "$pid"; then
  tail -30 "$LOG" >&2
  fail "build failed after $((SECONDS - start))s (nothing written to $OUT)"
fi
chmod 755 "$TMP"
# only a binary that runs and names the pin goes into the cache (an empty file "runs" too)
# (the output is read whole first: `grep -q` stops reading at its match, and under pipefail the
# binary's SIGPIPE on its next line would fail a good build now and then)
reported=$("$TMP" version 2>/dev/null || true)
grep -qx "k8s.io/kubernetes $PIN" <<<"$reported" ||
  fail "the built binary does not run or does not report k8s.io/kubernetes $PIN (nothing written to $OUT)"
mv -f "$TMP" "$OUT"
echo "$KEY" >"$OUT.key"
say "built $OUT in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s ($("$OUT" version | head -1))"

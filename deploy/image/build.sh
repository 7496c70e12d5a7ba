#!/usr/bin/env bash
# Builds the sluice image from the locally built static binary, with no
# registry access: the base is `scratch`, and the layers are the binary,
# this machine's CA bundle and the example configs (the same layout as the
# Dockerfile at the repository root).
#   deploy/image/build.sh BINARY [IMAGE] [VERSION]
# IMAGE defaults to localhost/sluice:dev, the name the Makefile's
# SLUICE_IMAGE, the Kubernetes manifests, the Helm chart and the Compose
# quickstart all use (deploy/test's TestOneImageName checks they agree).
# Needs buildah (Debian: apt-get install buildah). Storage and isolation can
# be chosen with buildah's own variables, e.g. STORAGE_DRIVER=vfs and
# BUILDAH_ISOLATION=chroot for nested or unprivileged containers.
set -euo pipefail
bin=${1:?usage: build.sh BINARY [IMAGE] [VERSION]}
image=${2:-${SLUICE_IMAGE:-localhost/sluice:dev}}
version=${3:-dev}
root=$(cd "$(dirname "$0")/../.." && pwd)
cacerts=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

command -v buildah >/dev/null || { echo "build.sh: buildah is missing (apt-get install buildah)" >&2; exit 1; }
[ -f "$cacerts" ] || { echo "build.sh: no CA bundle at $cacerts (apt-get install ca-certificates)" >&2; exit 1; }
if ! file "$bin" 2>/dev/null | grep -q 'statically linked'; then
  command -v file >/dev/null && { echo "build.sh: $bin is not a static binary (build it with CGO_ENABLED=0)" >&2; exit 1; }
fi

stage=$(mktemp -d)
ctr=
cleanup() { [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1; rm -rf "$stage"; }
trap cleanup EXIT
mkdir -p "$stage/etc/sluice" "$stage/etc/ssl/certs" "$stage/usr/local/bin"
install -m 0755 "$bin" "$stage/usr/local/bin/sluice"
install -m 0644 "$cacerts" "$stage/etc/ssl/certs/ca-certificates.crt"
install -m 0644 "$root/examples/sluice.yaml" "$root/examples/gateway.yaml" "$stage/etc/sluice/"
install -m 0644 "$root/deploy/envoy/sluice.yaml" "$stage/etc/sluice/envoy.yaml"
cp -r "$root/deploy/envoy/ratelimit" "$stage/etc/sluice/ratelimit"
chmod -R a+rX "$stage/etc"

# Docker format from the start: it keeps the HEALTHCHECK (OCI images have
# no such field), and buildah config warns that it drops the HEALTHCHECK
# when the working container is OCI, even if the commit is Docker.
ctr=$(buildah from --format docker scratch)
buildah copy --quiet "$ctr" "$stage" / >/dev/null
buildah config \
  --label org.opencontainers.image.title=sluice \
  --label "org.opencontainers.image.description=Distributed rate limiter: HTTP API, forward-auth, Envoy RLS, AI gateway" \
  --label org.opencontainers.image.source=https://github.com/sluice-io/sluice \
  --label "org.opencontainers.image.version=$version" \
  --user 65532:65532 --workingdir /etc/sluice \
  --port 8080 --port 8081 --port 8082 --port 8090 \
  --healthcheck 'CMD /usr/local/bin/sluice healthcheck' \
  --healthcheck-interval 10s --healthcheck-timeout 2s --healthcheck-start-period 5s --healthcheck-retries 3 \
  --entrypoint '["/usr/local/bin/sluice"]' \
  --cmd 'serve --config /etc/sluice/sluice.yaml' \
  "$ctr"
buildah commit --quiet --format docker "$ctr" "$image" >/dev/null
echo "built $image"

#!/usr/bin/env bash
# Checks an image built by build.sh without a container runtime daemon:
# runs `sluice version` and `sluice config check` of the bundled configs
# inside it (buildah run, chroot isolation), and checks its user,
# entrypoint and HEALTHCHECK.
#   deploy/image/test.sh [IMAGE] [VERSION]
set -euo pipefail
image=${1:-${SLUICE_IMAGE:-localhost/sluice:dev}}
version=${2:-dev}
ctr=$(buildah from "$image")
trap 'buildah rm "$ctr" >/dev/null 2>&1' EXIT
inside() { buildah run --isolation "${BUILDAH_ISOLATION:-chroot}" "$ctr" -- "$@"; }

got=$(inside /usr/local/bin/sluice version)
case "$got" in "sluice $version ("*) ;; *) echo "image-test: version printed \"$got\", want \"sluice $version (...)\"" >&2; exit 1 ;; esac
inside /usr/local/bin/sluice config check /etc/sluice/sluice.yaml /etc/sluice/gateway.yaml /etc/sluice/envoy.yaml /etc/sluice/ratelimit
inside /usr/local/bin/sluice healthcheck http://127.0.0.1:1/healthz 2>/dev/null && { echo "image-test: healthcheck passed with nothing listening" >&2; exit 1; }

cfg=$(buildah inspect --type image "$image" | tr -d ' \n')
for want in '"User":"65532:65532"' '"Entrypoint":["/usr/local/bin/sluice"]' '"Test":["CMD","/usr/local/bin/sluice","healthcheck"]' '"org.opencontainers.image.version":"'"$version"'"'; do
  case $cfg in *"$want"*) ;; *) echo "image-test: image config lacks $want: $cfg" >&2; exit 1 ;; esac
done
echo "image-test: ok: $got, configs valid, non-root, healthcheck set"

# syntax=docker/dockerfile:1
# sluice container image: the static binary, CA certificates and the example
# configs on an empty base, run as a non-root user.
#   docker build -t localhost/sluice:dev .   (or: podman build / buildah bud)
#   docker run --rm -p 8080:8080 localhost/sluice:dev
# Without registry access, `make image` builds the same image from the
# locally built binary (deploy/image/build.sh).

ARG GO_VERSION=1.26

FROM docker.io/library/golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice \
 && mkdir -p /out/etc/sluice \
 && cp examples/sluice.yaml examples/gateway.yaml /out/etc/sluice/ \
 && cp -r deploy/envoy/ratelimit /out/etc/sluice/ratelimit \
 && cp deploy/envoy/sluice.yaml /out/etc/sluice/envoy.yaml

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Distributed rate limiter: HTTP API, forward-auth, Envoy RLS, AI gateway" \
      org.opencontainers.image.source="https://github.com/sluice-io/sluice" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/sluice /usr/local/bin/sluice
COPY --from=build /out/etc/sluice /etc/sluice
# 65532: the conventional "nonroot" user of minimal images; no shell, no
# package manager, nothing writable but what the orchestrator mounts.
USER 65532:65532
WORKDIR /etc/sluice
EXPOSE 8080 8081 8082 8090
# `sluice healthcheck` GETs http://127.0.0.1:8080/healthz (the image has no
# curl); pass another URL for a different listen address.
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/sluice", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/sluice.yaml"]

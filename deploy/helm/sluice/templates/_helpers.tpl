{{/* The release's resource name. */}}
{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the pods. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every resource. */}}
{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the Redis URL, if any. */}}
{{- define "sluice.redisSecret" -}}
{{- if .Values.store.existingSecret -}}
{{- .Values.store.existingSecret -}}
{{- else if .Values.store.redisURL -}}
{{- printf "%s-redis" (include "sluice.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* sluice.yaml, built from the values. */}}
{{- define "sluice.config" -}}
{{- $store := dict "failure_policy" .Values.store.failurePolicy "timeout" .Values.store.timeout "instances" (int .Values.replicaCount) -}}
{{- if include "sluice.redisSecret" . -}}
{{- $_ := set $store "url_env" "SLUICE_REDIS_URL" -}}
{{- else -}}
{{- $_ := set $store "url" "memory" -}}
{{- end -}}
{{- if .Values.store.localCache }}{{ $_ := set $store "local_cache" true }}{{ end -}}
{{- $_ := set $store "max_keys" (int64 .Values.store.maxKeys) -}}
{{- $_ := set $store "max_bytes" (mul (int64 .Values.store.maxBytesMiB) 1048576) -}}
{{- $_ := set $store "plain_windows" (ne .Values.store.plainWindows false) -}}
{{- $cfg := dict "listen" (printf ":%d" (int .Values.port)) "shutdown_timeout" .Values.shutdownTimeout "store" $store -}}
{{- with .Values.policies }}{{ $_ := set $cfg "policies" . }}{{ end -}}
{{- with .Values.tiers }}{{ $_ := set $cfg "tiers" . }}{{ end -}}
{{- with .Values.keys }}{{ $_ := set $cfg "keys" . }}{{ end -}}
{{- with .Values.overrides }}{{ $_ := set $cfg "overrides" . }}{{ end -}}
{{- with .Values.authz }}{{ $_ := set $cfg "authz" . }}{{ end -}}
{{- if .Values.envoy.enabled -}}
{{- $_ := set $cfg "envoy" (dict "grpc_addr" (printf ":%d" (int .Values.envoy.grpcPort)) "config_dir" "/etc/sluice/ratelimit" "response_headers" .Values.envoy.responseHeaders "merge_domains" .Values.envoy.mergeDomains) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $gw := deepCopy .Values.gateway.config -}}
{{- $gs := $gw.store | default dict -}}
{{- if not (hasKey $gs "max_keys") }}{{ $_ := set $gs "max_keys" (int64 .Values.store.maxKeys) }}{{ end -}}
{{- $_ := set $gw "store" $gs -}}
{{- $_ := set $cfg "gateway" (merge (dict "listen" (printf ":%d" (int .Values.gateway.port))) $gw) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Whether the gateway keeps its limits in memory (its own store). */}}
{{- define "sluice.gatewayOnMemory" -}}
{{- if .Values.gateway.enabled -}}
{{- $url := "" -}}
{{- with .Values.gateway.config.store }}{{ $url = .url | default "" }}{{ end -}}
{{- if or (eq $url "") (eq $url "memory") }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/*
The container's memory, in MiB: memory.baseMiB plus memory.rssPerHeapMiB
for each MiB of heap a memory store may hold: store.maxBytesMiB (the
service's memory store, or on Redis its local fallback) and, when the
gateway keeps its limits in memory, its store's (the memory store's
default bound, 64 MiB: the gateway's store takes no max_bytes); rounded up. The one place the chart sizes
memory.
*/}}
{{- define "sluice.memoryMiB" -}}
{{- $heap := mul (int64 .Values.store.maxBytesMiB) 1048576 -}}
{{- if include "sluice.gatewayOnMemory" . -}}
{{- $heap = add $heap (mul 64 1048576) -}}
{{- end -}}
{{- $bytes := add (mul $heap (int64 .Values.memory.rssPerHeapMiB)) (mul (int64 .Values.memory.baseMiB) 1048576) -}}
{{- div (add $bytes 1048575) 1048576 -}}
{{- end -}}

{{/*
Refuses at render time what would not start or would not hold its limits.
Included by the Deployment, so `helm template`, `helm install` and
`helm upgrade` all stop on it.
*/}}
{{- define "sluice.validate" -}}
{{- $n := int .Values.replicaCount -}}
{{- if or (lt $n 1) (gt $n 64) -}}
{{- fail (printf "replicaCount is %d: it must be between 1 and 64 (store.instances, the local failure policy's divisor, takes no more)" $n) -}}
{{- end -}}
{{- if and (gt $n 1) (not (include "sluice.redisSecret" .)) -}}
{{- fail (printf "replicaCount is %d but no store.redisURL or store.existingSecret is set: on the memory store each replica keeps its own counts, so every limit would be %d times what you wrote. Set store.redisURL (or store.existingSecret) to a Redis all replicas share, or keep replicaCount: 1" $n $n) -}}
{{- end -}}
{{- if lt (int64 .Values.store.maxKeys) 1 -}}
{{- fail "store.maxKeys must be at least 1: the memory store needs a key bound" -}}
{{- end -}}
{{- if lt (int64 .Values.store.maxBytesMiB) 1 -}}
{{- fail "store.maxBytesMiB must be at least 1: the chart sizes the container's memory from it (memory.rssPerHeapMiB per MiB)" -}}
{{- end -}}
{{- with .Values.resources }}{{ if or (and .limits .limits.memory) (and .requests .requests.memory) -}}
{{- fail "resources.limits.memory and resources.requests.memory are computed from store.maxBytesMiB (memory.baseMiB + memory.rssPerHeapMiB × store.maxBytesMiB): set store.maxBytesMiB instead" -}}
{{- end }}{{ end -}}
{{- if .Values.gateway.enabled -}}
{{- $up := .Values.gateway.config.upstream | default dict -}}
{{- if and (not .Values.gateway.apiKeySecret.name) (not $up.allow_no_key) -}}
{{- fail (printf "gateway.enabled needs the upstream API key, which sluice gateway reads from $%s and would not start without: create a Secret (kubectl create secret generic openai --from-literal=api-key=sk-...) and set gateway.apiKeySecret.name (and gateway.apiKeySecret.key), or set gateway.config.upstream.allow_no_key: true for an upstream that needs none" ($up.api_key_env | default "OPENAI_API_KEY")) -}}
{{- end -}}
{{- if and (gt $n 1) (include "sluice.gatewayOnMemory" .) -}}
{{- fail (printf "replicaCount is %d but gateway.config.store.url is memory: each replica would keep its own gateway limits and budgets, so they would be %d times what you wrote. Set gateway.config.store.url to the Redis all replicas share, or keep replicaCount: 1" $n $n) -}}
{{- end -}}
{{- end -}}
{{- end -}}

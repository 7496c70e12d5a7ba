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
{{- if .Values.store.maxKeys }}{{ $_ := set $store "max_keys" (int .Values.store.maxKeys) }}{{ end -}}
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
{{- $_ := set $cfg "gateway" (merge (dict "listen" (printf ":%d" (int .Values.gateway.port))) .Values.gateway.config) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

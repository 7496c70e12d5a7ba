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

{{/* The variable a region's Redis URL comes in by: SLUICE_REGION_<NAME>_URL. */}}
{{- define "sluice.regionEnv" -}}
{{- printf "SLUICE_REGION_%s_URL" (. | upper | replace "-" "_" | replace "." "_") -}}
{{- end -}}

{{/* The other regions' Redis URLs, from their Secrets (env entries). */}}
{{- define "sluice.regionEnvs" -}}
{{- $out := list -}}
{{- if .Values.store.region -}}
{{- range $name, $r := .Values.store.regions -}}
{{- $out = append $out (dict "name" (include "sluice.regionEnv" $name) "valueFrom" (dict "secretKeyRef" (dict "name" ($r.existingSecret | default "") "key" ($r.existingSecretKey | default "url")))) -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
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
{{- with .Values.store.region -}}
{{- $_ := set $store "region" . -}}
{{- $regions := dict -}}
{{- range $name, $r := $.Values.store.regions -}}
{{- $_ := set $regions $name (dict "url_env" (include "sluice.regionEnv" $name)) -}}
{{- end -}}
{{- with $regions }}{{ $_ := set $store "regions" . }}{{ end -}}
{{- with $.Values.store.global }}{{ $_ := set $store "global" . }}{{ end -}}
{{- end -}}
{{- $cfg := dict "listen" (printf ":%d" (int .Values.port)) "shutdown_timeout" .Values.shutdownTimeout "store" $store -}}
{{- with .Values.policies }}{{ $_ := set $cfg "policies" . }}{{ end -}}
{{- with .Values.tiers }}{{ $_ := set $cfg "tiers" . }}{{ end -}}
{{- with .Values.keys }}{{ $_ := set $cfg "keys" . }}{{ end -}}
{{- with .Values.overrides }}{{ $_ := set $cfg "overrides" . }}{{ end -}}
{{- with .Values.authz }}{{ $_ := set $cfg "authz" . }}{{ end -}}
{{- with .Values.admin.tokens }}{{ $_ := set $cfg "admin_tokens" . }}{{ end -}}
{{- with .Values.allowedHosts }}{{ $_ := set $cfg "allowed_hosts" . }}{{ end -}}
{{- if .Values.console.enabled -}}
{{- $con := dict "enabled" true -}}
{{- with .Values.console.sampleInterval }}{{ $_ := set $con "sample_interval" . }}{{ end -}}
{{- with .Values.console.topSample }}{{ $_ := set $con "top_sample" (int .) }}{{ end -}}
{{- $_ := set $cfg "console" $con -}}
{{- end -}}
{{- if .Values.envoy.enabled -}}
{{- $_ := set $cfg "envoy" (dict "grpc_addr" (printf ":%d" (int .Values.envoy.grpcPort)) "config_dir" "/etc/sluice/ratelimit" "response_headers" .Values.envoy.responseHeaders "response_dynamic_metadata" (eq .Values.envoy.responseDynamicMetadata true) "merge_domains" .Values.envoy.mergeDomains) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $gw := include "sluice.gatewayConfig" . | fromYaml -}}
{{- with concat (.Values.allowedHosts | default list) ($gw.allowed_hosts | default list) | uniq }}{{ $_ := set $gw "allowed_hosts" . }}{{ end -}}
{{- $_ := set $cfg "gateway" (merge (dict "listen" (printf ":%d" (int .Values.gateway.port))) $gw) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The gateway: section from gateway.config: upstream (the default one when
neither upstream nor upstreams is given) or upstreams, never both.
*/}}
{{- define "sluice.gatewayConfig" -}}
{{- $gw := deepCopy (.Values.gateway.config | default dict) -}}
{{- if and (not $gw.upstream) (not $gw.upstreams) -}}
{{- $_ := set $gw "upstream" (dict "base_url" "https://api.openai.com/v1" "api_key_env" "OPENAI_API_KEY" "timeout" "5m") -}}
{{- end -}}
{{- if not $gw.upstream }}{{ $_ := unset $gw "upstream" }}{{ end -}}
{{- if not $gw.upstreams }}{{ $_ := unset $gw "upstreams" }}{{ end -}}
{{- toYaml $gw -}}
{{- end -}}

{{/*
The environment variables the gateway reads upstream keys from, each with
whether its upstream may go without (allow_no_key), as YAML: a map of
variable to true (a key is needed) or false.
*/}}
{{- define "sluice.gatewayKeyEnvs" -}}
{{- $gw := include "sluice.gatewayConfig" . | fromYaml -}}
{{- $envs := dict -}}
{{- with $gw.upstream -}}
{{- $def := "OPENAI_API_KEY" -}}
{{- if eq (.api | default "") "anthropic" }}{{ $def = "ANTHROPIC_API_KEY" }}{{ end -}}
{{- $_ := set $envs (.api_key_env | default $def) (not .allow_no_key) -}}
{{- end -}}
{{- range $gw.upstreams -}}
{{- if .key_env -}}
{{- $_ := set $envs .key_env (or (get $envs .key_env) (not .allow_no_key)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $envs -}}
{{- end -}}

{{/*
The gateway's key variables from Secrets, as env entries: gateway.keys,
and gateway.apiKeySecret for the single upstream's variable.
*/}}
{{- define "sluice.gatewayKeyEnv" -}}
{{- $out := list -}}
{{- if .Values.gateway.enabled -}}
{{- range .Values.gateway.keys -}}
{{- $out = append $out (dict "name" .env "valueFrom" (dict "secretKeyRef" (dict "name" .secret "key" (.key | default "api-key")))) -}}
{{- end -}}
{{- with .Values.gateway.apiKeySecret -}}{{- if .name -}}
{{- $gw := include "sluice.gatewayConfig" $ | fromYaml -}}
{{- $up := $gw.upstream | default dict -}}
{{- $def := "OPENAI_API_KEY" -}}
{{- if eq ($up.api | default "") "anthropic" }}{{ $def = "ANTHROPIC_API_KEY" }}{{ end -}}
{{- $out = append $out (dict "name" ($up.api_key_env | default $def) "valueFrom" (dict "secretKeyRef" (dict "name" .name "key" (.key | default "api-key")))) -}}
{{- end -}}{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The container's memory, in MiB: memory.baseMiB plus memory.rssPerHeapMiB
for each MiB of heap the memory store may hold: store.maxBytesMiB (the
service's memory store, which the gateway shares inside sluice serve, or
on Redis its local fallback); rounded up. The one place the chart sizes
memory.
*/}}
{{- define "sluice.memoryMiB" -}}
{{- $heap := mul (int64 .Values.store.maxBytesMiB) 1048576 -}}
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
{{- with .Values.store -}}
{{- if and .regions (not .region) -}}
{{- fail "store.regions is set without store.region: name this release's region (docs/regions.md)" -}}
{{- end -}}
{{- if .region -}}
{{- if not (regexMatch "^[A-Za-z0-9_.-]{1,64}$" (.region | toString)) -}}
{{- fail (printf "store.region %q: a region name is 1-64 letters, digits, '_', '-' or '.'" (.region | toString)) -}}
{{- end -}}
{{- if not (include "sluice.redisSecret" $) -}}
{{- fail "store.region is set but no store.redisURL or store.existingSecret: each region keeps its limits in its own Redis" -}}
{{- end -}}
{{- $envs := dict -}}
{{- range $name, $r := .regions -}}
{{- if not (regexMatch "^[A-Za-z0-9_.-]{1,64}$" $name) -}}
{{- fail (printf "store.regions: %q: a region name is 1-64 letters, digits, '_', '-' or '.'" $name) -}}
{{- end -}}
{{- if eq $name $.Values.store.region -}}
{{- fail (printf "store.regions.%s is this release's own region (store.region), whose Redis is store.redisURL/existingSecret: list only the others" $name) -}}
{{- end -}}
{{- if not (and (kindIs "map" $r) $r.existingSecret) -}}
{{- fail (printf "store.regions.%s needs existingSecret: the Secret holding that region's Redis URL (a URL carries its password, so the chart takes it from a Secret only)" $name) -}}
{{- end -}}
{{- $env := include "sluice.regionEnv" $name -}}
{{- if hasKey $envs $env -}}
{{- fail (printf "store.regions: %s and %s both read %s: rename one" (get $envs $env) $name $env) -}}
{{- end -}}
{{- $_ := set $envs $env $name -}}
{{- end -}}
{{- end -}}
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
{{- with .Values.admin -}}
{{- if gt (len (.tokens | default list)) 64 -}}
{{- fail (printf "admin.tokens has %d tokens: at most 64" (len .tokens)) -}}
{{- end -}}
{{- range $i, $t := .tokens | default list -}}
{{- if not (regexMatch "^[0-9a-fA-F]{64}$" ($t.hash | default "" | toString)) -}}
{{- fail (printf "admin.tokens[%d] (%s): hash must be the 64 hex digits of the token's SHA-256 (sluice keys hash --admin %s), never the token itself" $i ($t.name | default "?") ($t.name | default "NAME")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $cfg := .Values.gateway.config | default dict -}}
{{- if and $cfg.upstream $cfg.upstreams -}}
{{- fail "gateway.config has both upstream and upstreams: a gateway has one upstream or a pool (upstreams with routes), and sluice would refuse the config and crash-loop. Keep one; set the other to null" -}}
{{- end -}}
{{- if and $cfg.upstreams (not $cfg.routes) -}}
{{- fail "gateway.config.upstreams needs routes: (each client-facing model to the upstreams that serve it; docs/gateway.md, \"Upstream pools\")" -}}
{{- end -}}
{{- if hasKey $cfg "store" -}}
{{- fail "gateway.config.store is set, but inside sluice serve the gateway keeps its limits in the service's store and would ignore it: set store.redisURL (or store.existingSecret) instead, which keeps the URL in a Secret" -}}
{{- end -}}
{{- range $cfg.upstreams -}}
{{- if .key_file -}}
{{- fail (printf "gateway.config.upstreams %s: key_file is not mounted by the chart; use key_env and an entry in gateway.keys (a Secret's key as that variable)" (.name | default "?")) -}}
{{- end -}}
{{- end -}}
{{- $needed := include "sluice.gatewayKeyEnvs" . | fromYaml -}}
{{- $set := dict -}}
{{- range (include "sluice.gatewayKeyEnv" . | fromYamlArray) -}}
{{- if not (regexMatch "^[A-Za-z_][A-Za-z0-9_]*$" (.name | default "" | toString)) -}}
{{- fail (printf "gateway.keys: %q is not an environment variable name (env:), such as OPENAI_API_KEY; the key itself belongs in the Secret" (.name | default "" | toString)) -}}
{{- end -}}
{{- if hasKey $set .name -}}
{{- fail (printf "gateway.keys: $%s is set twice (gateway.keys and gateway.apiKeySecret, or two entries)" .name) -}}
{{- end -}}
{{- if not (hasKey $needed .name) -}}
{{- fail (printf "gateway.keys sets $%s, which no upstream of gateway.config reads (api_key_env, upstreams[].key_env): a misspelt variable would leave its upstream without a key" .name) -}}
{{- end -}}
{{- if not .valueFrom.secretKeyRef.name -}}
{{- fail (printf "gateway.keys: $%s names no Secret (secret:)" .name) -}}
{{- end -}}
{{- $_ := set $set .name true -}}
{{- end -}}
{{- range $env, $need := $needed -}}
{{- if and $need (not (hasKey $set $env)) -}}
{{- fail (printf "gateway.enabled needs the upstream key sluice reads from $%s and would not start without: create a Secret (kubectl create secret generic openai --from-literal=api-key=sk-...) and add {env: %s, secret: openai, key: api-key} to gateway.keys (or, for the single upstream, set gateway.apiKeySecret.name), or set allow_no_key: true on an upstream that needs none" $env $env) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

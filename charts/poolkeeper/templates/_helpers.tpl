{{/* The chart's name, overridable. */}}
{{- define "poolkeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: release name, plus the chart name unless it is part of it. */}}
{{- define "poolkeeper.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "poolkeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "poolkeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "poolkeeper.labels" -}}
{{ include "poolkeeper.selectorLabels" . }}
{{ include "poolkeeper.commonLabels" . }}
{{- end }}

{{- define "poolkeeper.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: poolkeeper
{{- end }}

{{/*
"true" when the API tier is on, else empty. Values without `api` come from
`helm upgrade --reuse-values`, which keeps the previous chart's defaults: refused, naming
the flag that merges the new defaults.
*/}}
{{- define "poolkeeper.api.enabled" -}}
{{- if not (hasKey .Values "api") }}
{{- fail "the values have no api.* (helm upgrade --reuse-values keeps the previous chart's defaults): upgrade with --reset-then-reuse-values instead (docs/operator.md, Upgrade)" }}
{{- end }}
{{- if .Values.api.enabled }}true{{ end }}
{{- end }}

{{/*
The API tier's objects. Its pods carry another app.kubernetes.io/name than the operator's:
the operator Deployment's selector (name and instance) is immutable, and must not match
the API pods.
*/}}
{{- define "poolkeeper.api.fullname" -}}
{{- printf "%s-api" (include "poolkeeper.fullname" . | trunc 59 | trimSuffix "-") }}
{{- end }}

{{- define "poolkeeper.api.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-api" (include "poolkeeper.name" . | trunc 59 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "poolkeeper.api.labels" -}}
{{ include "poolkeeper.api.selectorLabels" . }}
app.kubernetes.io/component: api
{{ include "poolkeeper.commonLabels" . }}
{{- end }}

{{/* The ServiceAccount of the API pods: they use no Kubernetes API, and mount no token. */}}
{{- define "poolkeeper.api.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- include "poolkeeper.api.fullname" . }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/* The labels of the pods behind the client Service: the API tier's, or the operator's. */}}
{{- define "poolkeeper.client.selectorLabels" -}}
{{- if include "poolkeeper.api.enabled" . }}
{{- include "poolkeeper.api.selectorLabels" . }}
{{- else }}
{{- include "poolkeeper.selectorLabels" . }}
{{- end }}
{{- end }}

{{- define "poolkeeper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "poolkeeper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces served in namespaced mode, as a JSON list (the release namespace by default). */}}
{{- define "poolkeeper.watchedNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- .Values.watch.namespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{- define "poolkeeper.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The operator's permissions, shared by the Role (namespaced) and the ClusterRole.
kopf adds and removes its finalizer and annotations by patching the RunnerPool itself
(no runnerpools/finalizers grant), writes status through the status subresource and
posts core/v1 Events; it runs without kopf peering, so nothing of kopf.dev. Scanning of
CRDs and namespaces is disabled in the operator, so neither is read.
*/}}
{{- define "poolkeeper.rbacRules" -}}
- apiGroups: ["poolkeeper.dev"]
  resources: ["runnerpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["poolkeeper.dev"]
  resources: ["runnerpools/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
The managed Poseidon environments' template as the ConfigMap holds it; empty when the
Poseidon API is off or has no template.
*/}}
{{- define "poolkeeper.poseidonTemplate" -}}
{{- if and .Values.poseidon.enabled .Values.poseidon.environmentTemplate }}
{{- toYaml .Values.poseidon.environmentTemplate }}
{{- end }}
{{- end }}

{{/*
The window of PoolkeeperNoReconcilePass: 3 resync periods, but at least
prometheusRule.minimumWindowSeconds, since increase() needs two scrapes in its window.
*/}}
{{- define "poolkeeper.reconcileWindow" -}}
{{- $periods := mulf 3 .Values.resyncSeconds | ceil | int }}
{{- max $periods (int .Values.prometheusRule.minimumWindowSeconds) }}s
{{- end }}

{{/* A NetworkPolicy's ingress rule for the listener: the API, health and metrics. */}}
{{- define "poolkeeper.httpIngress" -}}
- ports:
    - port: http
      protocol: TCP
  {{- with .Values.networkPolicy.ingressFrom }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* A NetworkPolicy's egress rules: DNS, and these TCP ports at any address. */}}
{{- define "poolkeeper.egress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- with . }}
- ports:
    {{- range . }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
{{- end }}

{{/*
A ServiceMonitor of one tier: `name`, its `labels`, and the `selectorLabels` of the
tier's Service (the client Service, or the operator's headless one).
*/}}
{{- define "poolkeeper.serviceMonitor" -}}
{{- $values := .root.Values }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- .labels | nindent 4 }}
    {{- with $values.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- .selectorLabels | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ .root.Release.Namespace }}
  endpoints:
    - port: http
      path: /metrics
      # poolkeeper's own `namespace` (Nomad's, of poolkeeper_event_stream_up) and
      # `endpoint` (of poolkeeper_nomad_requests_total) labels keep their names and
      # meaning (docs/reference.md) instead of becoming exported_namespace and
      # exported_endpoint beside the target's labels.
      honorLabels: true
      {{- if $values.apiTls.secretName }}
      scheme: https
      {{- with $values.serviceMonitor.tlsConfig }}
      tlsConfig:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
      interval: {{ $values.serviceMonitor.interval }}
      scrapeTimeout: {{ $values.serviceMonitor.scrapeTimeout }}
{{- end }}

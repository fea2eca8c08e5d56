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
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "poolkeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: poolkeeper
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
(no runnerpools/finalizers grant), writes status through the status subresource, posts
core/v1 Events, and keeps its peering object's status current. Scanning of CRDs and
namespaces is disabled in the operator, so neither is read.
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
- apiGroups: ["kopf.dev"]
  resources: [{{ if .Values.watch.allNamespaces }}"clusterkopfpeerings"{{ else }}"kopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
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

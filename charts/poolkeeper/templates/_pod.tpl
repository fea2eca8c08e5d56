{{/*
What the operator's pods and the API tier's pods have in common: both run the same image
with the same listener (API tokens, TLS, the Poseidon API), reach the same Nomad, and are
hardened alike.
*/}}

{{/* The pod template's annotations (podAnnotations, and the Poseidon template's checksum). */}}
{{- define "poolkeeper.podAnnotations" -}}
{{- if or .Values.podAnnotations (include "poolkeeper.poseidonTemplate" .) }}
annotations:
  {{- with .Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with include "poolkeeper.poseidonTemplate" . }}
  # The template is read at start: a changed one restarts the pods.
  checksum/poseidon-template: {{ . | sha256sum }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The pod spec's fields after its service account. */}}
{{- define "poolkeeper.podSettings" -}}
enableServiceLinks: false
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "poolkeeper.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* --log-format and --access-log. */}}
{{- define "poolkeeper.logArgs" -}}
- --log-format
- {{ .Values.logFormat | quote }}
{{- if .Values.accessLog }}
- --access-log
{{- end }}
{{- end }}

{{/* The listener's arguments: TLS, the API tokens, the Poseidon API. */}}
{{- define "poolkeeper.listenerArgs" -}}
{{- if .Values.apiTls.secretName }}
- --tls-cert
- /etc/poolkeeper/api-tls/tls.crt
- --tls-key
- /etc/poolkeeper/api-tls/tls.key
{{- end }}
{{- if .Values.apiTokens.insecureNoAuth }}
- --insecure-no-auth
{{- else }}
- --api-token-file
- /etc/poolkeeper/api/{{ .Values.apiTokens.key }}
{{- end }}
{{- with .Values.poseidon }}
{{- if .enabled }}
- --poseidon-api
- --poseidon-environments
- {{ .environments | quote }}
- --poseidon-depleting-threshold
- {{ .depletingThreshold | quote }}
{{- if .environmentTemplate }}
- --poseidon-environment-template
- /etc/poolkeeper/poseidon/template.yaml
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The NOMAD_* variables. `tokenSecret`: the Secret whose key `token` is NOMAD_TOKEN; the
connection Secret's token is optional, a Secret of its own must have one.
*/}}
{{- define "poolkeeper.nomadEnv" -}}
{{- $values := .root.Values }}
- name: NOMAD_ADDR
  valueFrom:
    secretKeyRef:
      name: {{ $values.nomad.secretName }}
      key: address
- name: NOMAD_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .tokenSecret | default $values.nomad.secretName }}
      key: token
      {{- if not .tokenSecret }}
      optional: true
      {{- end }}
{{- if $values.nomad.caCert }}
- name: NOMAD_CACERT
  value: /etc/poolkeeper/nomad/ca.crt
{{- end }}
{{- if $values.nomad.clientCert }}
- name: NOMAD_CLIENT_CERT
  value: /etc/poolkeeper/nomad/tls.crt
- name: NOMAD_CLIENT_KEY
  value: /etc/poolkeeper/nomad/tls.key
{{- end }}
{{- with $values.nomad.namespace }}
- name: NOMAD_NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- with $values.nomad.region }}
- name: NOMAD_REGION
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "poolkeeper.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if not .Values.apiTokens.insecureNoAuth }}
- name: api-tokens
  mountPath: /etc/poolkeeper/api
  readOnly: true
{{- end }}
{{- if or .Values.nomad.caCert .Values.nomad.clientCert }}
- name: nomad-tls
  mountPath: /etc/poolkeeper/nomad
  readOnly: true
{{- end }}
{{- if include "poolkeeper.poseidonTemplate" . }}
- name: poseidon-template
  mountPath: /etc/poolkeeper/poseidon
  readOnly: true
{{- end }}
{{- if .Values.apiTls.secretName }}
- name: api-tls
  mountPath: /etc/poolkeeper/api-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "poolkeeper.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if not .Values.apiTokens.insecureNoAuth }}
- name: api-tokens
  secret:
    secretName: {{ .Values.apiTokens.secretName }}
    defaultMode: 0440
    items:
      - key: {{ .Values.apiTokens.key }}
        path: {{ .Values.apiTokens.key }}
{{- end }}
{{- if or .Values.nomad.caCert .Values.nomad.clientCert }}
- name: nomad-tls
  secret:
    secretName: {{ .Values.nomad.secretName }}
    defaultMode: 0440
    items:
      {{- if .Values.nomad.caCert }}
      - key: ca.crt
        path: ca.crt
      {{- end }}
      {{- if .Values.nomad.clientCert }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- if include "poolkeeper.poseidonTemplate" . }}
- name: poseidon-template
  configMap:
    name: {{ include "poolkeeper.fullname" . }}-poseidon
{{- end }}
{{- if .Values.apiTls.secretName }}
- name: api-tls
  secret:
    secretName: {{ .Values.apiTls.secretName }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}

{{/*
Where the pods go: `nodeSelector`, `tolerations` and `affinity` of the tier; an empty
affinity prefers a different node for each of the tier's pods (`selectorLabels`).
*/}}
{{- define "poolkeeper.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- if .affinity }}
  {{- toYaml .affinity | nindent 2 }}
  {{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- .selectorLabels | nindent 14 }}
  {{- end }}
{{- end }}

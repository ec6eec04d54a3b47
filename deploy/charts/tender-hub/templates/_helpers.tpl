{{- define "tender-hub.labels" -}}
app.kubernetes.io/name: tender-hub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- define "tender-hub.selector" -}}
app.kubernetes.io/name: tender-hub
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- /* Pod labels of one Deployment (called with dict "root" "shard"). A shard's pods have
their own app name and the shard label, so no Deployment's selector matches another's pods; the
unsharded Deployment keeps the release selector (a selector is immutable on upgrade). */ -}}
{{- define "tender-hub.podSelector" -}}
{{- if .shard -}}
app.kubernetes.io/name: tender-hub-shard
app.kubernetes.io/instance: {{ .root.Release.Name }}
tender.dev/shard: {{ .shard.id | quote }}
{{- else -}}
{{ include "tender-hub.selector" .root }}
{{- end }}
{{- end }}

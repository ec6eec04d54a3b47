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

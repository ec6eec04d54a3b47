{{- define "tender-agent.labels" -}}
app.kubernetes.io/name: tender-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The chart's name, the release's full name, and the labels every object carries. */}}
{{- define "nursery.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nursery.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nursery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nursery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nursery.labels" -}}
{{ include "nursery.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The model repository the server is told about: the bucket URL, or the volume's path. */}}
{{- define "nursery.repository" -}}
{{- if .Values.modelRepository.url -}}
{{- .Values.modelRepository.url -}}
{{- else if .Values.modelRepository.volume -}}
{{- .Values.modelRepository.path -}}
{{- end -}}
{{- end -}}

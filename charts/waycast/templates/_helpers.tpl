{{/* The release's full name, at most 63 characters. */}}
{{- define "waycast.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "waycast.operatorName" -}}
{{- printf "%s-operator" (include "waycast.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "waycast.serviceAccountName" -}}
{{- default (include "waycast.operatorName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels every object of the release carries. */}}
{{- define "waycast.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: waycast
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selects the operator pods; never changes across upgrades. */}}
{{- define "waycast.operatorSelector" -}}
app.kubernetes.io/name: waycast-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "waycast.image" -}}
{{- printf "%s:%s" .repository (default .appVersion .tag) -}}
{{- end -}}

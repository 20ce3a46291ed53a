{{/* Chart name. */}}
{{- define "sandgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: RELEASE-sandgate, or the release name when it already says sandgate. */}}
{{- define "sandgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sandgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "sandgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sandgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sandgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sandgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sandgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sandgate.tokenSecret" -}}
{{- default (printf "%s-cluster-token" (include "sandgate.fullname" .)) .Values.cluster.tokenSecret -}}
{{- end -}}

{{/* Seconds in a duration such as 10s, 2m or 1m30s (hours, minutes, seconds). */}}
{{- define "sandgate.seconds" -}}
{{- $total := 0 -}}
{{- range $m := regexFindAll "[0-9]+[hms]" . -1 -}}
{{- $n := trimSuffix "h" (trimSuffix "m" (trimSuffix "s" $m)) | int -}}
{{- if hasSuffix "h" $m }}{{ $total = add $total (mul $n 3600) }}{{ else if hasSuffix "m" $m }}{{ $total = add $total (mul $n 60) }}{{ else }}{{ $total = add $total $n }}{{ end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The pod's grace: the preStop sleep, then SIGTERM's longest drain. */}}
{{- define "sandgate.terminationGrace" -}}
{{- if .Values.nodeAgent.terminationGracePeriodSeconds -}}
{{- .Values.nodeAgent.terminationGracePeriodSeconds -}}
{{- else -}}
{{- $shutdown := include "sandgate.seconds" .Values.sandgate.shutdownTimeout | int -}}
{{- add (.Values.nodeAgent.preStopSleepSeconds | int) (mul 3 $shutdown) 15 -}}
{{- end -}}
{{- end -}}

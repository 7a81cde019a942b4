{{/* The operator's name, labels and images. */}}
{{- define "undertow.name" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "undertow.labels" -}}
app.kubernetes.io/name: undertow-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: undertow
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "undertow.selector" -}}
app.kubernetes.io/name: undertow-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* An image: [images.registry/]repository:tag (tag: the chart's appVersion). */ -}}
{{- define "undertow.image" -}}
{{- $values := .Values.images -}}
{{- $image := index $values .name -}}
{{- with $values.registry }}{{ trimSuffix "/" . }}/{{ end -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}

{{- define "undertow.namespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- join "," .Values.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- /*
Names and labels HAMi's chart gives its Services, for the HAMi-compatible
Services (hami-services.yaml) and the webhook's Service reference: the
chart name is HAMi's, "hami", unless nameOverride says otherwise; the
full name is fullnameOverride, else the release name when it contains
that name, else <release>-<name> (63 characters at most). Helm-only.
*/ -}}
{{- define "vgpu.hami.name" -}}
{{- .Values.nameOverride | default "hami" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu.hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "vgpu.hami.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vgpu.hami.scheduler" -}}
{{- printf "%s-scheduler" (include "vgpu.hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu.hami.devicePlugin" -}}
{{- printf "%s-device-plugin" (include "vgpu.hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* What HAMi's ServiceMonitors select: component, name, instance. */ -}}
{{- define "vgpu.hami.labels" -}}
app.kubernetes.io/name: {{ include "vgpu.hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The release's full name: the release name, or <release>-ambientd, at most 63 characters. */}}
{{- define "ambientd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "ambientd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: control-plane
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels that select this release's pods. */}}
{{- define "ambientd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ambientd.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "ambientd.fullname" .) -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace so two releases never collide. */}}
{{- define "ambientd.clusterName" -}}
{{- printf "%s-%s" (include "ambientd.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "ambientd.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The mesh config file read with --mesh-config (only discoverySelectors today). */}}
{{/* The mesh config file (--mesh-config), or nothing when no value needs one. */}}
{{- define "ambientd.mesh" -}}
{{- if .Values.discoverySelectors }}
discoverySelectors:
{{ toYaml .Values.discoverySelectors }}
{{- end }}
{{- if .Values.serviceEntryVisibility }}
serviceEntryVisibility:
{{ toYaml .Values.serviceEntryVisibility | indent 2 }}
{{- end }}
{{- end -}}

{{/* --trusted-node-accounts: the value, or <release namespace>/ztunnel. */}}
{{- define "ambientd.trustedNodeAccounts" -}}
{{- if .Values.trustedNodeAccounts -}}
{{- join "," .Values.trustedNodeAccounts -}}
{{- else -}}
{{- printf "%s/ztunnel" .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The release's name prefix of every object (at most 63 characters less the longest suffix). */}}
{{- define "mooncake.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mooncake.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (list $ "master") */}}
{{- define "mooncake.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "mooncake.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
{{- end -}}

{{/* etcd endpoints (host:port), ";"-joined; empty without etcd. */}}
{{- define "mooncake.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $fn := include "mooncake.fullname" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s-etcd-%d.%s-etcd-peers.%s.svc:%d" $fn $i $fn $.Release.Namespace (int $.Values.etcd.clientPort)) -}}
{{- end -}}
{{- join ";" $eps -}}
{{- else -}}
{{- join ";" .Values.etcd.external.endpoints -}}
{{- end -}}
{{- end -}}

{{/* the leader's Service, host:port of its gRPC */}}
{{- define "mooncake.masterAddress" -}}
{{ printf "%s-master.%s.svc:%d" (include "mooncake.fullname" .) .Release.Namespace (int .Values.master.rpcPort) }}
{{- end -}}

{{/* Prometheus scrape annotations: (list $ port) */}}
{{- define "mooncake.scrapeAnnotations" -}}
{{- $ := index . 0 -}}
{{- if $.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{- define "mooncake.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: MC_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- end -}}

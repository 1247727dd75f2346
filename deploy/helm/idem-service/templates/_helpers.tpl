{{/* The chart's name, cut to 63 characters. */}}
{{- define "idem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: <release>-<chart> unless one contains the other. */}}
{{- define "idem.fullname" -}}
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

{{/* The console's name. */}}
{{- define "idem.consoleName" -}}
{{- printf "%s-console" (include "idem.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "idem.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "idem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: idem
{{- end -}}

{{/* Selector labels of a component: pass (list $ "service") or (list $ "console"). */}}
{{- define "idem.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "idem.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference: pass (list $ .Values.service.image). */}}
{{- define "idem.image" -}}
{{- $ := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: consumer.Config.ShutdownGrace for the
in-flight handler, plus the synchronous commit of the marked offsets, plus
closing the clients (values.yaml, service.shutdown).
*/}}
{{- define "idem.terminationGrace" -}}
{{- $s := .Values.service.shutdown -}}
{{- add $s.shutdownGraceSeconds $s.commitSeconds $s.extraSeconds -}}
{{- end -}}

{{/* A value from a Secret key: pass (list "ENV_NAME" secretRef). */}}
{{- define "idem.secretEnv" -}}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ (index . 1).name }}
      key: {{ (index . 1).key }}
{{- end -}}

{{/*
The connection environment of idem's CLI (docs/cli.md#connection-flags),
for the service and the console.
*/}}
{{- define "idem.connectionEnv" -}}
{{- $k := .Values.kafka -}}
- name: KAFKA_BROKERS
  value: {{ required "kafka.brokers is required" $k.brokers | quote }}
{{- if .Values.database.urlSecret.name }}
{{ include "idem.secretEnv" (list "DATABASE_URL" .Values.database.urlSecret) }}
{{- end }}
{{- if $k.tls.enabled }}
- name: IDEM_TLS
  value: "true"
{{- if $k.tls.caSecret.name }}
- name: IDEM_TLS_CA
  value: /etc/idem/kafka-ca/{{ $k.tls.caSecret.key }}
{{- end }}
{{- end }}
{{- with $k.sasl }}
{{- if .mechanism }}
- name: IDEM_SASL_MECHANISM
  value: {{ .mechanism | quote }}
{{- if eq (upper .mechanism) "OAUTHBEARER" }}
{{- with .oauth }}
{{- if .tokenURL }}
- name: IDEM_SASL_OAUTH_TOKEN_URL
  value: {{ .tokenURL | quote }}
- name: IDEM_SASL_OAUTH_CLIENT_ID
  value: {{ required "kafka.sasl.oauth.clientID is required with a tokenURL" .clientID | quote }}
{{- $_ := required "kafka.sasl.oauth.clientSecretSecret.name is required with a tokenURL" .clientSecretSecret.name }}
{{ include "idem.secretEnv" (list "IDEM_SASL_OAUTH_CLIENT_SECRET" .clientSecretSecret) }}
{{- end }}
{{- if .scopes }}
- name: IDEM_SASL_OAUTH_SCOPE
  value: {{ join "," .scopes | quote }}
{{- end }}
{{- if .audience }}
- name: IDEM_SASL_OAUTH_AUDIENCE
  value: {{ .audience | quote }}
{{- end }}
{{- if .extensions }}
- name: IDEM_SASL_OAUTH_EXTENSIONS
  value: {{ $ext := list }}{{ range $key, $v := .extensions }}{{ $ext = append $ext (printf "%s=%s" $key $v) }}{{ end }}{{ join "," $ext | quote }}
{{- end }}
{{- end }}
{{- else }}
- name: IDEM_SASL_USER
  value: {{ required "kafka.sasl.user is required with a SASL mechanism" .user | quote }}
{{- $_ := required "kafka.sasl.passwordSecret.name is required with a SASL mechanism" .passwordSecret.name }}
{{ include "idem.secretEnv" (list "IDEM_SASL_PASSWORD" .passwordSecret) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The volume and mount of the Kafka CA, when one is named ("" otherwise). */}}
{{- define "idem.caVolume" -}}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret.name -}}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret.name }}
{{- end -}}
{{- end -}}
{{- define "idem.caMount" -}}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret.name -}}
- name: kafka-ca
  mountPath: /etc/idem/kafka-ca
  readOnly: true
{{- end -}}
{{- end -}}

{{/* An HTTP probe: pass (list path port probeValues). */}}
{{- define "idem.probe" -}}
httpGet:
  path: {{ index . 0 }}
  port: {{ index . 1 }}
{{ toYaml (index . 2) }}
{{- end -}}
